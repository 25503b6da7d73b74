"""Backend discovery through entry points: selection order and the three loading errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from engine_fixtures import require_native_kernels

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
    assert installed_backend_names() == ["ascend", "cpu", "cuda", "reference"]


def test_default_backend_on_a_cpu_machine_is_cpu_where_its_kernels_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_native_kernels()
    monkeypatch.delenv("SPEC_BACKEND", raising=False)
    assert load_backend().name == "cpu"


def _default_in_a_fresh_process(**env: str) -> str:
    code = "from spec_backend.backends import load_backend; print(load_backend().name)"
    base = {k: v for k, v in os.environ.items() if k != "SPEC_BACKEND"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**base, **env}
    )
    return out.stdout.strip()


def test_default_backend_is_reference_where_the_cpu_kernels_cannot_run() -> None:
    """``SPEC_BACKEND_NATIVE=0`` turns the native kernels off: ``cpu`` is then unavailable, with the reason,
    and the default falls back to the pure-torch reference."""
    assert _default_in_a_fresh_process(SPEC_BACKEND_NATIVE="0") == "reference"
    code = "from spec_backend.cpu import CpuBackend; print(CpuBackend().probe())"
    env = {**os.environ, "SPEC_BACKEND_NATIVE": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert (
        out.stdout.strip() == "unavailable: the native CPU kernels do not build here: SPEC_BACKEND_NATIVE=0"
    )


def test_list_backends_reports_hardware_backends_unavailable_with_reason() -> None:
    infos = {i.name: i for i in list_backends()}
    assert infos["reference"].available and infos["reference"].device_type == "cpu"
    assert infos["cpu"].device_type == "cpu"
    assert not infos["cuda"].available and "torch" in infos["cuda"].reason
    assert not infos["ascend"].available and "torch_npu" in infos["ascend"].reason


def test_explicit_name_and_env_var_select_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_backend("ascend").name == "ascend"  # loading an unavailable backend is allowed
    monkeypatch.setenv("SPEC_BACKEND", "cuda")
    assert load_backend().name == "cuda"
    assert load_backend("reference").name == "reference"  # explicit name wins over the env var


def test_unknown_name_lists_installed_backends() -> None:
    with pytest.raises(
        BackendError, match=r"unknown backend 'tpu'; installed backends: ascend, cpu, cuda, reference"
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


def test_acceptance_command_prints_the_cpu_backend() -> None:
    require_native_kernels()
    assert _default_in_a_fresh_process() == "cpu"


_FAKE_BACKEND = """
from spec_backend.backends.reference import ReferenceBackend


class {cls}(ReferenceBackend):
    name = "{name}"

{body}
"""


def _plugin_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> None:
    """Install a fake plugin ``name`` whose backend class (a ReferenceBackend) has ``body`` added."""
    cls = f"{name.title()}Backend"
    source = _FAKE_BACKEND.format(cls=cls, name=name, body=textwrap.indent(textwrap.dedent(body), "    "))
    _fake_distribution(tmp_path, f"{name}_plugin", {name: f"{name}_mod:{cls}"}, {f"{name}_mod": source})
    monkeypatch.syspath_prepend(str(tmp_path))


def test_plugin_with_an_extra_graph_runner_argument_is_rejected_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin_with(
        tmp_path,
        monkeypatch,
        "wrongsig",
        """
        def graph_runner(self, fn, capture_sizes, enforce_eager=None):
            return super().graph_runner(fn, capture_sizes)
        """,
    )
    with pytest.raises(
        BackendError,
        match=r"backend plugin 'wrongsig' \(wrongsig_mod\.WrongsigBackend\) overrides "
        r"graph_runner\(self, fn, capture_sizes, enforce_eager=None\), but the Backend contract is "
        r"graph_runner\(self, fn, capture_sizes\)",
    ):
        load_backend("wrongsig")
    with pytest.raises(BackendError, match=r"'wrongsig'.*graph_runner"):
        list_backends()  # discovery rejects it too


@pytest.mark.parametrize(
    ("name", "body", "shown"),
    [
        (
            "policy",
            "def capture_policy(self, num_hidden_layers):\n    return None\n",
            r"capture_policy\(self, num_hidden_layers\)",
        ),
        (
            "attn",
            "def attention_function(self, layer):\n    return None\n",
            r"attention_function\(self, layer\)",
        ),
        ("ops", "@staticmethod\ndef sampler_ops():\n    return None\n", r"sampler_ops\(\)"),
        ("tuning", "sampler_tuning = None\n", r"sampler_tuning = None"),
    ],
)
def test_every_contract_method_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str, shown: str
) -> None:
    _plugin_with(tmp_path, monkeypatch, name, body)
    with pytest.raises(BackendError, match=rf"backend plugin '{name}' .* overrides {shown}, but the Backend"):
        load_backend(name)


def test_a_plugin_that_keeps_the_signatures_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: renamed annotations do not matter, the parameters (names, kinds, defaults) do."""
    _plugin_with(
        tmp_path,
        monkeypatch,
        "fine",
        """
        def graph_runner(self, fn: object, capture_sizes: object) -> object:
            return super().graph_runner(fn, capture_sizes)

        def capture_policy(self, num_hidden_layers=None):
            return super().capture_policy(num_hidden_layers)
        """,
    )
    assert load_backend("fine").name == "fine"
