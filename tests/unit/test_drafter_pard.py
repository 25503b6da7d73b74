"""``draft_model`` with ``parallel_drafting=True`` (PARD): K drafts from one draft forward over the
catch-up tokens and K-1 mask tokens (``pard_token`` in the draft's ``config.json``, as PARD checkpoints
ship it). Oracle: the draft model's own full-sequence forward over the committed tokens followed by the
mask tokens, read by transformers (no cache), so a mask row left in the draft cache would show."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import PROMPTS, check_rebuilds, one_thread  # noqa: F401 - one_thread is autouse

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.draft_model import DraftModelDrafter
from spec_backend.tools.tiny import make_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=20)
PARD = 3  # the mask token id


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("target"), "llama", seed=0)


def _pard(path: Path, arch: str = "qwen2", seed: int = 5, **fields: Any) -> str:
    directory = make_tiny_model(path, arch, seed=seed)
    config = json.loads(Path(directory, "config.json").read_text())
    Path(directory, "config.json").write_text(json.dumps({**config, **fields}))
    return directory


@pytest.fixture(scope="module")
def pard_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _pard(tmp_path_factory.mktemp("pard"), pard_token=PARD, spd_type="pard")


def _spec(draft: str, k: int) -> dict[str, Any]:
    return {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": draft,
        "num_speculative_tokens": k,
        "parallel_drafting": True,
    }


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_identity_with_one_draft_forward_per_step(target_dir: str, pard_dir: str, k: int) -> None:
    expected = [o.outputs[0].token_ids for o in LLM(target_dir, dtype="float64").generate(PROMPTS, GREEDY)]
    llm = LLM(target_dir, dtype="float64", speculative_config=_spec(pard_dir, k))
    drafter: Any = llm.engine.drafter
    assert isinstance(drafter, DraftModelDrafter) and drafter.mask_token_id == PARD
    forwards, proposals = [], []
    runner_forward, propose = drafter.runner.forward, drafter.propose
    drafter.runner.forward = lambda *a, **kw: forwards.append(1) or runner_forward(*a, **kw)
    drafter.propose = lambda inputs: proposals.append(max(inputs.budgets) > 0) or propose(inputs)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    assert llm.metrics.total.num_draft_tokens > 0
    assert len(forwards) == sum(proposals)  # one draft forward per step that drafts, whatever K
    assert llm.engine.slots.num_slots == 0 and llm.engine.slots.consistent()


@torch.inference_mode()
def test_drafts_match_the_draft_models_own_reading(target_dir: str, tmp_path: Path) -> None:
    """The draft is the target's own weights: draft 1 is always accepted, so the cache keeps an accepted
    draft where a mask row was and must hold the draft token there, not the mask."""
    from transformers import AutoModelForCausalLM

    k = 3
    pard_dir = _pard(tmp_path / "same", "llama", 0, pard_token=PARD)
    draft = AutoModelForCausalLM.from_pretrained(pard_dir, dtype=torch.float64).eval()
    llm = LLM(target_dir, dtype="float64", speculative_config=_spec(pard_dir, k))

    def oracle(committed: list[int]) -> list[int]:  # the last committed row, then the mask rows
        logits = draft(torch.tensor([committed + [PARD] * (k - 1)])).logits[0, len(committed) - 1 :]
        return list(logits.argmax(-1).tolist())

    check_rebuilds(llm, oracle, max_tokens=12)
    assert llm.metrics.total.num_accepted_tokens >= llm.metrics.total.num_drafts  # draft 1: always


def test_parallel_drafting_needs_a_pard_draft(target_dir: str, tmp_path: Path) -> None:
    plain = make_tiny_model(tmp_path / "plain", "qwen2", seed=5)
    with pytest.raises(ValueError, match=r"needs a PARD draft model: .*pard_token or ptd_token_id"):
        LLM(target_dir, speculative_config=_spec(plain, 2))
    bad = _pard(tmp_path / "bad", ptd_token_id=500)
    with pytest.raises(ValueError, match=r"pard_token must be a token id in \[0, 128\), got 500"):
        LLM(target_dir, speculative_config=_spec(bad, 2))
