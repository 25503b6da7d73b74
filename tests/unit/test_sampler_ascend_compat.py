"""vllm-ascend's compatibility rules reproduced exactly (block verify ``cumulative``, entropy verify).

The expectation is a plain transcription of vllm-ascend's kernels (``vllm_ascend/ops/triton/
reject_sample.py``: ``rejection_random_sample_block_verify_kernel`` and ``rejection_random_sample_kernel``),
fed the very uniforms our sampler draws (``rng.uniform_f64`` keyed by seed, position and slot) and our
entropy thresholds; the accepted counts must agree for every request, on the torch and triton ops. The
batches mix ratios above 1, q(x) = 0, p(x) = 0 and placeholders, and both batch regimes (longest block
K >= 3: block rule; K < 3: vllm-ascend's token-level rule).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from triton_backend import MODES, TritonReferenceBackend

from spec_backend.backends.base import SamplerTuning
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata, rng
from spec_backend.sampling.probs import entropy_thresholds

V = 12
P = -1
TUNING = SamplerTuning(vocab_block=16, max_grid=None, device_uniforms=True)


def _ascend_count(p: list[float], q: list[float], u: list[float], tau: list[float], block: bool) -> int:
    """vllm-ascend's accepted count for one request (its kernels' loops, transcribed)."""
    if not block:  # rejection_random_sample_kernel: accept while q > 0 and p/q >= tau·u
        n = 0
        for pi, qi, ui, ti in zip(p, q, u, tau, strict=True):
            if not (qi > 0 and pi / qi >= ti * ui):
                break
            n += 1
        return n
    pi_run, cum_u, last = 1.0, 1.0, -1
    for i, (pi, qi, ui, ti) in enumerate(zip(p, q, u, tau, strict=True)):
        if math.isnan(pi):  # a placeholder: pi = 0, and it stays 0
            pi_run = 0.0
            continue
        cum_u *= ui
        with np.errstate(divide="ignore", invalid="ignore"):
            pi_run = float(min(np.float64(pi_run) * pi / np.float64(qi), 1.0))
        if qi > 0 and pi_run >= ti * cum_u:
            last = i
    return last + 1


def _batch(ks: list[int], seed: int) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(sum(ks) + len(ks), V, generator=gen) * 2.0  # [T+B, V]
    logits[logits < -2.5] = float("-inf")  # some p(x) = 0
    dprobs = torch.softmax(torch.randn(sum(ks), V, generator=gen) * 2.0, dim=-1)  # [T, V]
    dprobs[dprobs < 0.02] = 0.0  # some q(x) = 0
    drafts, t = [], 0
    for k in ks:
        row = [int(torch.randint(0, V, (1,), generator=gen)) for _ in range(k)]
        if k >= 3 and torch.rand(1, generator=gen) < 0.3:
            row[int(torch.randint(1, k, (1,), generator=gen))] = P
        drafts.append(row)
        t += k
    return drafts, logits, dprobs


def _expected(
    mode: str, drafts: list[list[int]], logits: torch.Tensor, dprobs: torch.Tensor | None, seeds: list[int]
) -> list[int]:
    cfg = MODES[mode]
    probs = torch.softmax(logits, dim=-1).double()  # temperature 1: the processed target
    tau = entropy_thresholds(logits, cfg.posterior_alpha, cfg.posterior_threshold)  # [T+B]
    block = cfg.enable_block_verify and max(map(len, drafts)) >= 3
    out, row, t = [], 0, 0
    for b, d in enumerate(drafts):
        slots = torch.arange(len(d))
        u = rng.uniform_f64(torch.full_like(slots, seeds[b]), torch.full_like(slots, 7 * b), slots, 1)
        ps = [float("nan") if x == P else float(probs[row + j, x]) for j, x in enumerate(d)]
        qs = [
            0.0 if x == P else (float(dprobs[t + j, x]) if dprobs is not None else 1.0)
            for j, x in enumerate(d)
        ]
        taus = [float(tau[row + j]) if cfg.enable_entropy_verify else 1.0 for j in range(len(d))]
        out.append(_ascend_count(ps, qs, u.tolist(), taus, block))
        row, t = row + len(d) + 1, t + len(d)
    return out


@pytest.mark.parametrize("mode", ["block-cumulative", "block-cumulative+entropy", "entropy"])
@pytest.mark.parametrize("ks", [[3, 5, 1, 6, 2, 4], [2, 1, 2], [1]], ids=["long", "short", "one"])
@pytest.mark.parametrize("with_q", [0, 1])
@pytest.mark.parametrize("ops", ["torch", "triton"])
def test_accepted_counts_equal_vllm_ascend(mode: str, ks: list[int], with_q: int, ops: str) -> None:
    backend = ReferenceBackend() if ops == "torch" else TritonReferenceBackend(TUNING)
    sampler = RejectionSampler(MODES[mode], backend=backend)
    for seed in range(4 if ops == "torch" else 1):
        drafts, logits, dprobs = _batch(ks, seed)
        seeds = [100 + seed * 10 + b for b in range(len(ks))]
        sampling = SamplingMetadata.from_lists(
            [1.0] * len(ks), seeds=seeds, positions=[7 * b for b in range(len(ks))]
        )
        q = dprobs if with_q else None
        out = sampler(SpecDecodeMetadata.from_draft_tokens(drafts), q, logits, sampling)
        got = [sum(1 for t in r if t != P) - 1 for r in out.tolist()]
        assert got == _expected(mode, drafts, logits, q, seeds), (mode, seed, drafts)


def test_entropy_is_vllm_ascends_formula() -> None:
    """H = −Σ p·ln(p + 1e−10) over softmax(raw logits), τ = min(exp(−α·H), θ)."""
    logits = torch.tensor([[2.0, 1.0, 0.5, float("-inf")], [0.0, 0.0, 0.0, 0.0]])
    p = torch.softmax(logits, dim=-1).double()
    h = -(p * torch.log(p + 1e-10)).sum(dim=-1)
    want = torch.clamp(torch.exp(-0.4 * h), max=0.95)
    assert torch.allclose(entropy_thresholds(logits, 0.4, 0.95), want, rtol=1e-6, atol=0)


def test_cumulative_with_entropy_uses_the_current_threshold_only() -> None:
    """K = 3, point-mass drafts with p(x) = 1, 1, 0.5: before the fix the product of all three thresholds
    scaled the uniforms' product, which accepts more; vllm-ascend's rule uses the current τ only."""
    logits = torch.full((4, V), -40.0)
    logits[0, 1] = logits[1, 2] = 40.0  # p(x) = 1 at the first two drafts: τ = 0.95 there (H = 0)
    logits[2, :2] = 0.0  # third row: two equal tokens, p(x) = 0.5, τ = exp(−0.4·ln 2)
    md = SpecDecodeMetadata.from_draft_tokens([[1, 2, 0]])
    sampler = RejectionSampler(MODES["block-cumulative+entropy"])
    tau = entropy_thresholds(logits, 0.4, 0.95).tolist()
    differs = 0
    for seed in range(300):
        sampling = SamplingMetadata.from_lists([1.0], seeds=[seed], positions=[0])
        u = rng.uniform_f64(torch.tensor([seed] * 3), torch.zeros(3, dtype=torch.long), torch.arange(3), 1)
        cu = u.cumprod(0).tolist()
        want = 3 if tau[2] * cu[2] <= 0.5 else 2  # positions 1 and 2 always pass (π = 1 >= τ·U)
        old = 3 if tau[0] * tau[1] * tau[2] * cu[2] < 0.5 else 2
        differs += want != old
        out = sampler(md, None, logits, sampling).tolist()[0]
        assert sum(1 for t in out if t != P) - 1 == want
    assert differs > 0  # the case separates the two rules
