"""Fixtures shared by the drafter tests: a tiny target and its greedy outputs without speculation."""

from __future__ import annotations

import pytest
from engine_fixtures import GREEDY, PROMPTS

from spec_backend.engine import LLM
from spec_backend.tools.tiny import make_tiny_model


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Llama target (vocabulary 128, hidden size 32)."""
    return make_tiny_model(tmp_path_factory.mktemp("target"), "llama")


@pytest.fixture(scope="module")
def expected(target_dir: str) -> list[list[int]]:
    """The target's greedy outputs for ``PROMPTS`` without speculation (float64)."""
    return [o.outputs[0].token_ids for o in LLM(target_dir, dtype="float64").generate(PROMPTS, GREEDY)]
