"""``spec-backend demo`` end to end on a tiny model with a tokenizer: every method's texts equal plain
decoding's (the command fails otherwise); each drafter runs with the engine's default (the draft length
chosen per step), and ``--fixed-draft-length`` adds it again drafting K every step, reported beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from spec_backend.tools.demo import drafter_specs, main
from spec_backend.tools.tiny import make_tiny_model


def test_drafter_specs_default_and_fixed() -> None:
    assert list(drafter_specs(3)) == ["plain", "ngram", "suffix"]
    specs = drafter_specs(3, fixed=True)
    assert list(specs) == ["plain", "ngram", "suffix", "ngram+fixed", "suffix+fixed"]
    for name in ("ngram", "suffix"):
        default, fixed = specs[name], specs[f"{name}+fixed"]
        assert default is not None and fixed == {**default, "adaptive_draft_length": False}
        assert "adaptive_draft_length" not in default  # the engine's default: adaptive


def test_demo_runs_every_method_losslessly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_tiny_model(tmp_path, "llama", with_tokenizer=True, eos_token_id=1)
    argv = ["--model", model, "--num-prompts", "1", "--max-tokens", "8", "--fixed-draft-length"]
    assert main(argv) == 0
    table = capsys.readouterr().out.split("same text as plain", 1)[1]
    for name in ("plain", "ngram", "suffix", "ngram+fixed", "suffix+fixed"):
        assert any(
            line.split(" | ")[0].strip() == name and line.endswith("| yes") for line in table.splitlines()
        )
