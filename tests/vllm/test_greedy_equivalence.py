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


def test_greedy_rows_of_a_mixed_batch_identical(vllm_own: Any) -> None:
    """Greedy and sampled requests together: the greedy rows still match vLLM token for token."""
    ours = vllm_rejection_sampler(MODES["block-lossless"])
    drafts, logits = _case(7)
    temps = [0.0, 0.8, 0.0, 1.0]
    meta = spec_metadata(drafts)
    sm = sampling_metadata(temps)
    expected = vllm_own(meta, None, logits.clone(), sm).sampled_token_ids
    got = ours(meta, None, logits.clone(), sm).sampled_token_ids
    greedy = torch.tensor(temps) == 0
    assert torch.equal(got[greedy], expected[greedy])
    assert got.shape == expected.shape
