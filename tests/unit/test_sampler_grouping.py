"""Verifying in groups of requests (SamplerTuning.group_elements) gives exactly the one-pass output."""

from __future__ import annotations

import pytest
import torch

from spec_backend.backends.base import SamplerTuning
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.config.rejection import RejectionSamplerConfig as Config
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata
from spec_backend.sampling.grouping import request_groups

V = 50
KS = [3, 0, 5, 2, 4, 1, 0, 7, 6]
MODES = {
    "standard": Config(),
    "block-lossless": Config(enable_block_verify=True),
    "block-cumulative": Config(enable_block_verify=True, block_verify_mode="cumulative"),
    "entropy": Config(enable_entropy_verify=True),
    "block-lossless+entropy": Config(enable_block_verify=True, enable_entropy_verify=True),
}


class GroupedBackend(ReferenceBackend):
    """The reference backend with another group budget (None: one pass)."""

    name = "grouped-reference"

    def __init__(self, group_elements: int | None) -> None:
        self._group_elements = group_elements

    def sampler_tuning(self) -> SamplerTuning:
        return SamplerTuning(group_elements=self._group_elements)


def _inputs(seed: int) -> tuple[list[list[int]], torch.Tensor, torch.Tensor, SamplingMetadata]:
    gen = torch.Generator().manual_seed(seed)
    drafts = [torch.randint(0, V, (k,), generator=gen).tolist() for k in KS]
    logits = torch.randn(sum(k + 1 for k in KS), V, generator=gen) * 2.0  # [T + B, V]
    draft_probs = torch.softmax(torch.randn(sum(KS), V, generator=gen) * 2.0, dim=-1)  # [T, V]
    batch = len(KS)
    sampling = SamplingMetadata.from_lists(
        temperature=[0.0 if i % 4 == 1 else 0.6 + 0.1 * i for i in range(batch)],  # some greedy
        top_k=[0, 5, 0, 10, 0, 0, 3, 0, 0],
        top_p=[1.0, 1.0, 0.8, 1.0, 0.9, 1.0, 1.0, 0.5, 1.0],
        seeds=[100 + i for i in range(batch)],
        positions=[7 * i for i in range(batch)],
    )
    return drafts, logits, draft_probs, sampling


@pytest.mark.parametrize("budget", [1, 3 * V, 20 * V])  # one request per group, a few, most of the batch
@pytest.mark.parametrize("point_mass", [False, True])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_grouped_output_equals_one_pass(mode: str, point_mass: bool, budget: int) -> None:
    whole = RejectionSampler(MODES[mode], backend=GroupedBackend(None))
    grouped = RejectionSampler(MODES[mode], backend=GroupedBackend(budget))
    for seed in range(4):
        drafts, logits, draft_probs, sampling = _inputs(seed)
        metadata = SpecDecodeMetadata.from_draft_tokens(drafts)
        probs = None if point_mass else draft_probs
        want = whole(metadata, probs, logits, sampling)
        got = grouped(metadata, probs, logits, sampling)
        assert got.dtype == torch.int32 and torch.equal(got, want)


def test_grouped_synthetic_and_unseeded_requests_equal_one_pass() -> None:
    """Unseeded requests draw one seed per call before the split, from the same generator state."""
    rates = [0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1]
    drafts, logits, _, _ = _inputs(5)
    metadata = SpecDecodeMetadata.from_draft_tokens(drafts)
    sampling = SamplingMetadata.random(len(KS), temperature=0.8)
    for method, config, kwargs in (("synthetic", Config(), {"synthetic_acceptance_rates": rates}),):
        whole = RejectionSampler(config, method, GroupedBackend(None), **kwargs)
        grouped = RejectionSampler(config, method, GroupedBackend(2 * V), **kwargs)
        torch.manual_seed(11)
        want = whole(metadata, None, logits, sampling)
        torch.manual_seed(11)
        assert torch.equal(grouped(metadata, None, logits, sampling), want)
    whole, grouped = (
        RejectionSampler(backend=GroupedBackend(None)),
        RejectionSampler(backend=GroupedBackend(V)),
    )
    torch.manual_seed(12)
    want = whole(metadata, None, logits, sampling)
    torch.manual_seed(12)
    assert torch.equal(grouped(metadata, None, logits, sampling), want)


def test_grouping_rebuilds_a_permuted_logits_layout() -> None:
    """Logits rows in another order (indices say where each row is) are regrouped correctly."""
    drafts, logits, draft_probs, sampling = _inputs(9)
    standard = SpecDecodeMetadata.from_draft_tokens(drafts)
    perm = torch.randperm(
        logits.shape[0], generator=torch.Generator().manual_seed(0)
    )  # new row r = old perm[r]
    where = torch.argsort(perm).to(torch.int32)  # old row -> its new row
    permuted = SpecDecodeMetadata(
        draft_token_ids=standard.draft_token_ids,
        num_draft_tokens=standard.num_draft_tokens,
        cu_num_draft_tokens=standard.cu_num_draft_tokens,
        target_logits_indices=where[standard.target_logits_indices.to(torch.int64)],
        bonus_logits_indices=where[standard.bonus_logits_indices.to(torch.int64)],
        logits_indices=standard.logits_indices,
    )
    config = Config(enable_block_verify=True)
    want = RejectionSampler(config, backend=GroupedBackend(None))(standard, draft_probs, logits, sampling)
    grouped = RejectionSampler(config, backend=GroupedBackend(4 * V))
    assert torch.equal(grouped(permuted, draft_probs, logits[perm], sampling), want)


def test_request_groups_cover_each_request_once_within_the_budget() -> None:
    assert request_groups([3, 0, 5, 2], vocab_size=10, group_elements=50) == [(0, 2), (2, 3), (3, 4)]
    assert request_groups([3, 0, 5, 2], vocab_size=10, group_elements=90) == [(0, 2), (2, 4)]
    assert request_groups([3, 0, 5, 2], vocab_size=10, group_elements=1) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert request_groups([3, 0, 5, 2], vocab_size=10, group_elements=10**6) == [(0, 4)]
    assert request_groups([], vocab_size=10, group_elements=40) == []


def test_reference_backend_groups_and_bad_budget_is_rejected() -> None:
    assert ReferenceBackend().sampler_tuning().group_elements == 1 << 21
    with pytest.raises(ValueError, match=r"group_elements must be None or >= 1, got 0"):
        SamplerTuning(group_elements=0)
