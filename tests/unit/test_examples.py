"""The examples in ``examples/`` run as written (on tiny local models instead of the bundled one)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from spec_backend.tools.tiny import make_tiny_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_offline_draft_model_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = make_tiny_model(tmp_path / "target", vocab_size=256, with_tokenizer=True)
    draft = make_tiny_model(tmp_path / "draft", "qwen2", vocab_size=256, seed=3, with_tokenizer=True)
    main = runpy.run_path(str(EXAMPLES / "offline_draft_model.py"))["main"]
    texts = main(["--model", target, "--draft", draft, "--k", "3", "--max-tokens", "8"])
    assert len(texts) == 2
    printed = capsys.readouterr().out
    assert printed.count("Generated: ") == 2 and "drafted " in printed
