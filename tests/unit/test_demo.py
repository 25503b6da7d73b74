"""``spec-backend demo`` end to end on a tiny model with a tokenizer: every method's texts equal plain
decoding's (the command fails otherwise), and ``--adaptive-draft-length`` adds each drafter again with the
draft length chosen per step, reported beside the fixed one."""

from __future__ import annotations

from pathlib import Path

import pytest

from spec_backend.tools.demo import drafter_specs, main
from spec_backend.tools.tiny import make_tiny_model


def test_drafter_specs_with_and_without_adaptive() -> None:
    assert list(drafter_specs(3)) == ["plain", "ngram", "suffix"]
    specs = drafter_specs(3, adaptive=True)
    assert list(specs) == ["plain", "ngram", "suffix", "ngram+adaptive", "suffix+adaptive"]
    for name in ("ngram", "suffix"):
        fixed, adaptive = specs[name], specs[f"{name}+adaptive"]
        assert fixed is not None and adaptive == {**fixed, "adaptive_draft_length": True}
        assert "adaptive_draft_length" not in fixed


def test_demo_runs_every_method_losslessly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_tiny_model(tmp_path, "llama", with_tokenizer=True, eos_token_id=1)
    argv = ["--model", model, "--num-prompts", "1", "--max-tokens", "8", "--adaptive-draft-length"]
    assert main(argv) == 0
    table = capsys.readouterr().out.split("same text as plain", 1)[1]
    for name in ("plain", "ngram", "suffix", "ngram+adaptive", "suffix+adaptive"):
        assert any(
            line.split(" | ")[0].strip() == name and line.endswith("| yes") for line in table.splitlines()
        )
