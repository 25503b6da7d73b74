"""The `spec-backend backends` command and the vLLM plugin hook's safety without vLLM."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from spec_backend import cli
from spec_backend.integrations import vllm as vllm_plugin


def test_backends_command_lists_all_with_status_and_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["backend", "device", "status"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"ascend", "cuda", "reference"}
    assert "available" in rows["reference"] and "unavailable" not in rows["reference"]
    assert "unavailable: torch_npu is not installed" in rows["ascend"] and rows["ascend"].split()[-2:] == [
        "16",
        "128",
    ]
    assert "unavailable:" in rows["cuda"] and "unlimited" in rows["cuda"]


def test_console_script_is_installed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "spec_backend.cli", "backends"], capture_output=True, text=True, check=True
    )
    assert "reference" in out.stdout
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts["spec-backend"] == "spec_backend.cli:main"


def test_help_imports_neither_torch_nor_transformers() -> None:
    """``spec-backend --help`` (every subcommand listed) answers without the heavy imports (~2 s)."""
    code = (
        "import sys\n"
        "from spec_backend.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'}), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip() == "[]"
    for command in ("backends", "generate", "bench", "demo", "train-eagle3"):
        assert command in out.stdout


@pytest.mark.parametrize(
    ("command", "module", "extra"),
    [
        (["generate", "--model", "smollm2", "--prompt", "hi"], "transformers", "engine"),
        (["serve", "smollm2"], "uvicorn", "serve"),
    ],
)
def test_command_without_its_extra_names_it(command: list[str], module: str, extra: str) -> None:
    """A core-only install (no transformers), or no serve extra: the command says which extra to install."""
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None  # as if not installed: importing it raises ModuleNotFoundError\n"
        "from spec_backend.cli import main\n"
        f"sys.exit(main({command!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr[-2000:]
    expected = f"spec-backend {command[0]}: needs the {extra} extra (module {module!r} is not installed)"
    assert expected in out.stderr
    assert f"pip install '.[{extra}]'" in out.stderr and "Traceback" not in out.stderr


def test_vllm_plugin_entry_point_and_idempotent_register() -> None:
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert eps["spec_backend"] == "spec_backend.integrations.vllm:register"
    vllm_plugin.register()
    vllm_plugin.register()  # second call is a no-op
    assert vllm_plugin.is_registered()
