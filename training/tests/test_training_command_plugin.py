"""``train-eagle3`` reaches ``spec-backend`` as a command plugin, and the core does not import training."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

from spec_backend import cli


def test_train_eagle3_is_registered_in_the_command_group() -> None:
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=cli.COMMAND_GROUP)}
    assert eps["train-eagle3"] == "spec_backend_train.pipeline:add_parser"


def test_help_lists_train_eagle3_without_torch_and_core_commands_without_training() -> None:
    """``spec-backend --help`` loads the plugin without torch; the core never imports the training code."""
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
    assert "train-eagle3" in out.stdout
    code = (
        "import sys\n"
        "import spec_backend.engine, spec_backend.server.cli, spec_backend.cli\n"
        "print(sorted(m for m in sys.modules if m.startswith('spec_backend_train')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
