"""The fused verification of point-mass drafts (``triton.fused``) against the composed triton ops
and the torch reference, token for token.

The fused path replaces softmax + scan + residual race for ``draft_probs=None`` with the rules whose
``VerifyRule.fused`` is set (standard, block-lossless). Its race is compared in log space and its
block residual mass is b·(1 − p(x)) rather than a blocked sum, so equality with the reference holds on
inputs without float32 near-ties, which seeded random inputs are (as in ``test_triton_sampler``). The
inputs cover what the kernels branch on: greedy and sampled requests in one batch, temperatures != 1,
K = 0, null drafts (placeholders and ids >= V), rows with -inf logits, drafts that are mostly accepted
(long chains) or mostly rejected, a permuted logits layout, split rows and a capped grid.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from triton_backend import TritonReferenceBackend, make_sampler

from spec_backend.backends.base import SamplerTuning
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.config.rejection import RejectionSamplerConfig
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata
from spec_backend.sampling.ops import FusedVerifyOps
from spec_backend.sampling.triton.ops import TritonSamplerOps

V = 80
TUNINGS = {
    "plain": SamplerTuning(vocab_block=32),
    "split": SamplerTuning(vocab_block=16, vocab_splits=3),
    "capped": SamplerTuning(vocab_block=32, max_grid=2, vocab_splits=2),
    "tile": SamplerTuning(vocab_block=64, vocab_splits=2, fused_block=16),  # 5 tiles in 2 chunks
}
RULES = ("standard", "block-lossless")


class Counting(TritonReferenceBackend):
    """The triton reference backend, counting the fused calls."""

    calls = 0

    def sampler_ops(self) -> Any:
        ops = super().sampler_ops()
        outer = self

        class Spy:
            def __getattr__(self, name: str) -> Any:
                fn = getattr(ops, name)
                if name != "fused_verify":
                    return fn

                def counted(*args: Any) -> Any:
                    outer.calls += 1
                    return fn(*args)

                return counted

        return Spy()


def batch(seed: int, ks: list[int], accept_bias: float) -> tuple[SpecDecodeMetadata, torch.Tensor, list[int]]:
    """Drafts, logits [T + B, V] in a permuted row layout, and the temperatures' greedy mask source.

    ``accept_bias``: probability that a draft is its row's argmax (long accepted chains when high)."""
    gen = torch.Generator().manual_seed(seed)
    total, batch_size = sum(ks), len(ks)
    logits = torch.randn(total + batch_size, V, generator=gen) * 4.0  # [N, V]
    logits[1, : V // 2] = float("-inf")  # a masked half-vocabulary
    perm = torch.randperm(total + batch_size, generator=gen)  # row i of the layout lives at perm[i]
    drafts: list[int] = []
    for t in range(total):
        take_max = torch.rand(1, generator=gen).item() < accept_bias
        other = int(torch.randint(0, V, (1,), generator=gen))
        drafts.append(int(logits[perm[_layout_row(t, ks)]].argmax()) if take_max else other)
    if total > 2:
        drafts[1], drafts[-1] = -1, V + 5  # a placeholder and an id outside the vocabulary
    md = SpecDecodeMetadata.from_draft_tokens([[0] * k for k in ks])
    target = perm[torch.tensor([_layout_row(t, ks) for t in range(total)], dtype=torch.int64)]
    bonus = perm[torch.tensor([_bonus_row(b, ks) for b in range(batch_size)], dtype=torch.int64)]
    md = dataclasses.replace(
        md,
        draft_token_ids=torch.tensor(drafts, dtype=torch.int32),
        target_logits_indices=target.to(torch.int32),
        bonus_logits_indices=bonus.to(torch.int32),
        max_draft_token_id=None,
        standard_layout=False,
    )
    return md, logits, drafts


def _layout_row(t: int, ks: list[int]) -> int:
    b, start = 0, 0
    while t >= start + ks[b]:
        start += ks[b]
        b += 1
    return start + b + (t - start)


def _bonus_row(b: int, ks: list[int]) -> int:
    return sum(ks[: b + 1]) + b


def sampling_for(ks: list[int], seed: int) -> SamplingMetadata:
    temps = [0.0 if i % 3 == 0 else (0.7, 1.0, 1.3)[i % 3] for i in range(len(ks))]
    return SamplingMetadata.from_lists(
        temps,
        seeds=[seed * 101 + i for i in range(len(ks))],
        positions=[17 * i + seed for i in range(len(ks))],
    )


KS = [3, 0, 5, 1, 4, 2]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("tuning", list(TUNINGS))
def test_fused_equals_reference(rule: str, tuning: str) -> None:
    """Three seeded batches: two with drafts mostly the argmax (long chains), one mostly rejected."""
    backend = Counting(TUNINGS[tuning])
    accepted, rejected = 0, 0
    for seed, accept_bias in enumerate((0.9, 0.9, 0.3)):
        md, logits, _ = batch(seed, KS, accept_bias)
        sampling = sampling_for(KS, seed)
        expected = make_sampler(rule, ReferenceBackend())(md, None, logits, sampling)
        got = make_sampler(rule, backend)(md, None, logits, sampling)
        assert torch.equal(got, expected), (seed, got, expected)
        counts = (got >= 0).sum(dim=1) - 1  # [B] accepted drafts
        accepted += int(counts.sum())
        rejected += int((counts < torch.tensor(KS)).sum())
    assert backend.calls == 3
    assert accepted >= 6 and rejected >= 6  # both outcomes occur: the comparison is not vacuous


def draft_probs_for(md: SpecDecodeMetadata, logits: torch.Tensor, seed: int) -> torch.Tensor:
    """q [T, V] sharper than the target rows (its top tokens get more than p: the residual max(p − q, 0)
    then differs from p without the draft), zero at some tokens, and drafts drawn from it (written into
    ``md``); placeholders keep their -1."""
    gen = torch.Generator().manual_seed(100 + seed)
    target = torch.softmax(logits[md.target_logits_indices.long()], dim=-1)  # [T, V]
    noise = torch.softmax(torch.randn(target.shape, generator=gen) * 3, dim=-1)  # [T, V]
    sharp = target**2 / (target**2).sum(dim=-1, keepdim=True)  # [T, V]
    q = 0.8 * sharp + 0.2 * noise
    q[:, :7] = 0.0  # tokens the drafter never proposes: p/q = inf would accept them
    q = q / q.sum(dim=-1, keepdim=True)
    drafts = torch.multinomial(q, 1, generator=gen).squeeze(1).to(torch.int32)  # [T]
    md.draft_token_ids.copy_(torch.where(md.draft_token_ids < 0, md.draft_token_ids, drafts))
    return q


@pytest.mark.parametrize("tuning", list(TUNINGS))
def test_fused_with_draft_probabilities_equals_reference(tuning: str) -> None:
    """The token-level rule with draft probabilities (ρ = p(x)/q(x), residual max(p − q, 0)): the same
    tokens as the reference, sampled and greedy requests mixed; block-lossless with q composes."""
    backend = Counting(TUNINGS[tuning])
    accepted, rejected = 0, 0
    for seed in range(3):
        md, logits, _ = batch(seed, KS, 0.5)
        q = draft_probs_for(md, logits, seed)
        sampling = sampling_for(KS, seed)
        expected = make_sampler("standard", ReferenceBackend())(md, q, logits, sampling)
        got = make_sampler("standard", backend)(md, q, logits, sampling)
        assert torch.equal(got, expected), (seed, got, expected)
        counts = (got >= 0).sum(dim=1) - 1  # [B]
        accepted += int(counts.sum())
        rejected += int((counts < torch.tensor(KS)).sum())
    assert backend.calls == 3
    assert accepted >= 6 and rejected >= 6


def test_fused_equals_composed_triton_ops() -> None:
    """The same tokens with ``fused_verify=False`` (softmax, scan and residual race composed)."""
    md, logits, _ = batch(7, KS, 0.7)
    sampling = sampling_for(KS, 7)
    for rule in RULES:
        composed = TritonReferenceBackend(dataclasses.replace(TUNINGS["split"], fused_verify=False))
        fused = make_sampler(rule, TritonReferenceBackend(TUNINGS["split"]))(md, None, logits, sampling)
        assert torch.equal(fused, make_sampler(rule, composed)(md, None, logits, sampling))


@pytest.mark.parametrize("ties", [False, True])
def test_all_greedy_batch_fused(ties: bool) -> None:
    """Greedy only (the kernels skip the race); with ``ties`` the logits take 3 values, so every row's
    maximum repeats across tiles and chunks: the first index wins, as torch.argmax's."""
    ks = [4, 2, 0, 6]
    backend = Counting(TUNINGS["split"])
    md, logits, _ = batch(3, ks, 0.8)
    if ties:
        logits = torch.randint(0, 3, logits.shape, generator=torch.Generator().manual_seed(1)).float()
    sampling = SamplingMetadata.from_lists([0.0] * len(ks))
    for rule in RULES:
        expected = make_sampler(rule, ReferenceBackend())(md, None, logits, sampling)
        assert torch.equal(make_sampler(rule, backend)(md, None, logits, sampling), expected)
    assert backend.calls == 2


def test_fused_path_only_where_it_applies() -> None:
    ks = [3, 2]
    md, logits, _ = batch(1, ks, 0.5)
    plain = SamplingMetadata.from_lists([1.0, 0.8], seeds=[1, 2])
    top_k = SamplingMetadata.from_lists([1.0, 0.8], top_k=[5, 0], seeds=[1, 2])
    q = torch.softmax(torch.randn(sum(ks), V), dim=-1)  # [T, V]
    for tuning, dprobs, sampling, mode, fused in [
        (TUNINGS["plain"], None, plain, "standard", 1),
        (TUNINGS["plain"], None, plain, "block-lossless", 1),
        (TUNINGS["plain"], q, plain, "standard", 1),  # the token-level chain takes draft probabilities
        (TUNINGS["plain"], q, plain, "block-lossless", 0),  # block residual masses need whole q rows
        (TUNINGS["plain"], None, top_k, "standard", 0),  # top-k needs a sort
        (TUNINGS["plain"], None, plain, "entropy", 0),  # thresholds
        (TUNINGS["plain"], None, plain, "block-cumulative", 0),
        (dataclasses.replace(TUNINGS["plain"], fused_verify=False), None, plain, "standard", 0),
        (dataclasses.replace(TUNINGS["plain"], device_uniforms=False), None, plain, "standard", 0),
    ]:
        backend = Counting(tuning)
        expected = make_sampler(mode, ReferenceBackend())(md, dprobs, logits, sampling)
        assert torch.equal(make_sampler(mode, backend)(md, dprobs, logits, sampling), expected), mode
        assert backend.calls == fused, (mode, tuning, dprobs is None, sampling.apply_top_k)


def test_triton_ops_declare_the_fused_capability() -> None:
    assert isinstance(TritonSamplerOps(), FusedVerifyOps)
    assert TritonSamplerOps(SamplerTuning(device_uniforms=True)).fuses_verify()
    assert not TritonSamplerOps(SamplerTuning(device_uniforms=False)).fuses_verify()
    assert not TritonSamplerOps(SamplerTuning(fused_verify=False)).fuses_verify()
    ops = TritonSamplerOps(TUNINGS["plain"])
    args = ((), torch.zeros(1), torch.zeros(1), torch.zeros(1), 0)
    with pytest.raises(ValueError, match="got rule='cumulative' with draft_probs None"):
        ops.fused_verify(torch.zeros(1, V), None, *args, "cumulative", True)
    with pytest.raises(
        ValueError, match=r"'block' \(point-mass drafts only\), got rule='block' with draft_probs given"
    ):
        ops.fused_verify(torch.zeros(1, V), torch.zeros(1, V), *args, "block", True)


def test_fused_sampler_keeps_seeded_results_across_batch_order() -> None:
    """A seeded request's tokens do not depend on its neighbours (keys are per request and position)."""
    ks = [3, 4]
    md, logits, drafts = batch(5, ks, 0.6)
    sampler = RejectionSampler(RejectionSamplerConfig(), backend=TritonReferenceBackend(TUNINGS["plain"]))
    both = sampler(md, None, logits, SamplingMetadata.from_lists([1.0, 0.9], seeds=[7, 8], positions=[3, 4]))
    rows = [*md.target_logits_indices[3:].tolist(), int(md.bonus_logits_indices[1])]
    alone_md = SpecDecodeMetadata.from_layout(torch.tensor(drafts[3:], dtype=torch.int32), [4], None)
    alone = sampler(
        alone_md, None, logits[rows], SamplingMetadata.from_lists([0.9], seeds=[8], positions=[4])
    )
    assert torch.equal(alone[0], both[1])
