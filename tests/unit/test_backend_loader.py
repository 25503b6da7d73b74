"""Backend discovery through entry points: selection order and the three loading errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spec_backend.backends import BackendError, list_backends, load_backend
from spec_backend.backends.loader import installed_backend_names


def _fake_distribution(root: Path, name: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """Write an installed-looking distribution (dist-info + modules) under ``root``."""
    dist = root / f"{name}-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.0\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[spec_backend.backends]\n{lines}\n")
    for mod, source in modules.items():
        (root / f"{mod}.py").write_text(textwrap.dedent(source))


def test_installed_backends_are_the_three_distributions() -> None:
    assert installed_backend_names() == ["ascend", "cuda", "reference"]


def test_default_backend_on_cpu_machine_is_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPEC_BACKEND", raising=False)
    assert load_backend().name == "reference"


def test_list_backends_reports_hardware_backends_unavailable_with_reason() -> None:
    infos = {i.name: i for i in list_backends()}
    assert infos["reference"].available and infos["reference"].device_type == "cpu"
    assert not infos["cuda"].available and "torch" in infos["cuda"].reason
    assert not infos["ascend"].available and "torch_npu" in infos["ascend"].reason


def test_explicit_name_and_env_var_select_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_backend("ascend").name == "ascend"  # loading an unavailable backend is allowed
    monkeypatch.setenv("SPEC_BACKEND", "cuda")
    assert load_backend().name == "cuda"
    assert load_backend("reference").name == "reference"  # explicit name wins over the env var


def test_unknown_name_lists_installed_backends() -> None:
    with pytest.raises(
        BackendError, match=r"unknown backend 'tpu'; installed backends: ascend, cuda, reference"
    ):
        load_backend("tpu")


def test_plugin_that_fails_to_import_is_named_with_its_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distribution(
        tmp_path,
        "broken_plugin",
        {"broken": "broken_backend_mod:BrokenBackend"},
        {"broken_backend_mod": "raise ImportError('libfoo.so: cannot open shared object file')\n"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        BackendError, match=r"backend plugin 'broken' .* failed to load: ImportError: libfoo.so"
    ):
        load_backend("broken")
    with pytest.raises(BackendError, match=r"'broken'"):
        list_backends()  # discovery never swallows a broken plugin


def test_two_plugins_with_one_name_are_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_distribution(
        tmp_path, "impostor", {"reference": "spec_backend.backends.reference:ReferenceBackend"}, {}
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BackendError, match=r"backend name\(s\) \['reference'\]"):
        load_backend("reference")


def test_acceptance_command_prints_reference() -> None:
    code = "from spec_backend.backends import load_backend; print(load_backend().name)"
    env = {k: v for k, v in __import__("os").environ.items() if k != "SPEC_BACKEND"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "reference"
