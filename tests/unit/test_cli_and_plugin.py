"""The `spec-backend backends` command, command plugins, and the vLLM plugin hook's safety without vLLM."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spec_backend import cli
from spec_backend.integrations import vllm as vllm_plugin


def test_backends_command_lists_all_with_status_and_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["backends"]) == 0
    out = capsys.readouterr().out
    lines, details = out.split("\n\n", 1)[0].splitlines(), out.split("\n\n")[1:]
    assert lines[0].split()[:3] == ["backend", "device", "status"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"ascend", "cpu", "cuda", "reference"}
    assert "available" in rows["reference"] and "unavailable" not in rows["reference"]
    assert rows["cpu"].split()[1] == "cpu" and "available" in rows["cpu"]  # with its reason or note
    assert "unavailable: torch_npu is not installed" in rows["ascend"] and rows["ascend"].split()[-2:] == [
        "16",
        "128",
    ]
    assert "unavailable:" in rows["cuda"] and "unlimited" in rows["cuda"]
    cpu = details[0].splitlines()  # the cpu backend's kernels: their ISA variant and why, the fast path
    assert cpu[0] == "cpu:" and cpu[1].startswith("  kernels: ") and "generic: runs here" in cpu[2]
    assert cpu[4].startswith("  q4_1 path for a SmolLM2-135M layer, measured now: ")


def test_console_script_is_installed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "spec_backend.cli", "backends"], capture_output=True, text=True, check=True
    )
    assert "reference" in out.stdout
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts["spec-backend"] == "spec_backend.cli:main"


def test_help_imports_neither_torch_nor_transformers() -> None:
    """``spec-backend --help`` (every subcommand listed) answers without the heavy imports (~2 s), and
    without the serve extra's (a core-only install has neither: ``scripts/check_install.sh``)."""
    code = (
        "import sys\n"
        "from spec_backend.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = {'torch', 'transformers', 'fastapi', 'starlette', 'uvicorn'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip() == "[]"
    for command in ("backends", "generate", "bench", "demo", "serve"):
        assert command in out.stdout


PLUGIN = """
def add_hello(sub):
    sub.add_parser("hello", help="say hello")

def add_backends(sub):
    sub.add_parser("backends")

def add_two(sub):
    sub.add_parser("hello")
    sub.add_parser("hello-again")
"""


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[importlib.metadata.EntryPoint]:
    """The installed command plugins replaced by the list the test fills; ``cli_plugin_mod`` importable."""
    (tmp_path / "cli_plugin_mod.py").write_text(textwrap.dedent(PLUGIN))
    (tmp_path / "cli_plugin_broken.py").write_text("raise ValueError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps: list[importlib.metadata.EntryPoint] = []
    monkeypatch.setattr(cli, "_command_entry_points", lambda: eps)
    return eps


def _entry(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=cli.COMMAND_GROUP)


def test_a_command_plugin_adds_its_subcommand(plugins: list[importlib.metadata.EntryPoint]) -> None:
    plugins.append(_entry("hello", "cli_plugin_mod:add_hello"))
    assert cli.build_parser().parse_args(["hello"]).command == "hello"


def test_the_installed_plugins_are_read_from_the_entry_point_group() -> None:
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=cli.COMMAND_GROUP)}
    assert {ep.name: ep.value for ep in cli._command_entry_points()} == installed


@pytest.mark.parametrize(
    ("value", "cause", "detail"),
    [
        ("cli_plugin_missing:add", ModuleNotFoundError, "No module named 'cli_plugin_missing'"),
        ("cli_plugin_broken:add", ValueError, "broken on purpose"),
        ("cli_plugin_mod:no_such_function", AttributeError, "no_such_function"),
    ],
)
def test_a_plugin_that_fails_to_import_is_raised_with_its_name(
    plugins: list[importlib.metadata.EntryPoint], value: str, cause: type[Exception], detail: str
) -> None:
    plugins.append(_entry("hello", value))
    with pytest.raises(cli.CommandPluginError) as info:
        cli.build_parser()
    message = str(info.value)
    assert message.startswith(
        f"command plugin 'hello' ({value}, from an unnamed distribution) failed to import"
    )
    assert detail in message and isinstance(info.value.__cause__, cause)


def test_a_plugin_named_as_a_command_that_exists_is_refused(
    plugins: list[importlib.metadata.EntryPoint],
) -> None:
    plugins.append(_entry("backends", "cli_plugin_mod:add_backends"))
    with pytest.raises(
        cli.CommandPluginError,
        match=r"^command plugin 'backends' .* is refused: the command "
        r"'backends' already exists \(from spec-backend itself\)",
    ):
        cli.build_parser()


def test_a_second_plugin_with_the_same_name_is_refused(plugins: list[importlib.metadata.EntryPoint]) -> None:
    plugins += [_entry("hello", "cli_plugin_mod:add_hello"), _entry("hello", "cli_plugin_mod:add_hello")]
    with pytest.raises(cli.CommandPluginError, match=r"the command 'hello' already exists \(from an unnamed"):
        cli.build_parser()


@pytest.mark.parametrize(
    ("name", "value", "detail"),
    [
        (
            "hello",
            "cli_plugin_mod:add_two",
            "must add exactly the command 'hello', it added ['hello', 'hello-again']",
        ),
        ("greet", "cli_plugin_mod:add_hello", "must add exactly the command 'greet', it added ['hello']"),
    ],
)
def test_a_plugin_must_add_exactly_the_command_it_is_named_after(
    plugins: list[importlib.metadata.EntryPoint], name: str, value: str, detail: str
) -> None:
    plugins.append(_entry(name, value))
    with pytest.raises(cli.CommandPluginError) as info:
        cli.build_parser()
    assert str(info.value).startswith(f"command plugin {name!r}") and detail in str(info.value)


def test_a_plugin_that_adds_an_existing_command_under_its_own_name_is_refused(
    plugins: list[importlib.metadata.EntryPoint],
) -> None:
    """The entry's name is new, but its function re-adds ``backends``: argparse's clash, with the name."""
    plugins.append(_entry("mine", "cli_plugin_mod:add_backends"))
    with pytest.raises(cli.CommandPluginError, match=r"^command plugin 'mine' .*(failed to add|must add)"):
        cli.build_parser()


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


def test_backends_works_without_the_engine_extra() -> None:
    """``spec-backend backends`` in a core-only install (no transformers): every backend is listed and
    the cpu backend's measured path says what it needs, instead of the command failing
    (``scripts/check_install.sh`` runs it so)."""
    code = (
        "import sys\n"
        "sys.modules['transformers'] = None  # as if not installed\n"
        "from spec_backend.cli import main\n"
        "sys.exit(main(['backends']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "reference" in out.stdout and "cpu" in out.stdout
    if "q4_1 path" in out.stdout:  # only where a kernel variant builds here
        assert "not measured: the layer needs the engine extra" in out.stdout


def test_vllm_plugin_entry_point_and_idempotent_register() -> None:
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert eps["spec_backend"] == "spec_backend.integrations.vllm:register"
    vllm_plugin.register()
    vllm_plugin.register()  # second call is a no-op
    assert vllm_plugin.is_registered()
