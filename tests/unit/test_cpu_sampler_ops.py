"""The cpu backend's greedy batches verified by one native call (``cpu/sampler_ops``): the composed
reference ops' output exactly — ties, NaN rows, null drafts (placeholders), requests without drafts,
float32 and float64 logits — the sampler taking it for all-greedy batches only, and bad inputs refused
by name."""

from __future__ import annotations

import random

import pytest
import torch
from engine_fixtures import require_native_kernels

from spec_backend.backends.reference import ReferenceBackend
from spec_backend.config.rejection import RejectionSamplerConfig
from spec_backend.cpu import CpuBackend
from spec_backend.cpu.sampler_ops import CpuSamplerOps
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata


@pytest.fixture(autouse=True)
def _kernels() -> None:
    require_native_kernels()


def _batch(seed: int, dtype: torch.dtype) -> tuple[SpecDecodeMetadata, torch.Tensor]:
    """Integer logits (many exact ties) with NaN in some rows; drafts that follow the argmax for a while,
    then differ, or are null (the placeholder -1: the sampler refuses ids past the vocabulary)."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    v = rng.choice([5, 17, 64])
    ks = [rng.randint(0, 6) for _ in range(rng.randint(1, 7))]
    logits = torch.randint(-3, 3, (sum(k + 1 for k in ks), v), generator=gen).to(dtype)  # [N, V]
    for r in range(logits.shape[0]):
        if rng.random() < 0.15:
            logits[r, rng.randrange(v)] = float("nan")
    drafts, row = [], 0
    for k in ks:
        mine = []
        for j in range(k):
            best = int(torch.argmax(logits[row + j]))
            pick = rng.random()
            mine.append(best if pick < 0.7 else -1 if pick < 0.85 else rng.randrange(v))
        drafts.append(mine)
        row += k + 1
    return SpecDecodeMetadata.from_draft_tokens(drafts), logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equals_the_composed_reference_ops(dtype: torch.dtype) -> None:
    ops = CpuBackend().sampler_ops()
    assert isinstance(ops, CpuSamplerOps)
    reference = RejectionSampler(backend=ReferenceBackend())
    tied = 0
    for seed in range(300):
        md, logits = _batch(seed, dtype)
        want = reference(md, None, logits, SamplingMetadata.greedy(md.batch_size))
        rows = (md.target_logits_indices, md.bonus_logits_indices, md.cu_num_draft_tokens)
        got = ops.greedy_output(logits, md.draft_token_ids, *rows, md.max_spec_len)
        assert got.dtype == torch.int32 and torch.equal(got, want), seed
        tied += int(any(int((r == r.max()).sum()) > 1 for r in logits))
    assert tied > 200  # first-maximum ties were exercised (a last-maximum argmax fails them)


def test_the_sampler_takes_it_for_all_greedy_batches_only(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = RejectionSampler(backend=CpuBackend())
    calls: list[int] = []
    native = sampler.ops.greedy_output  # type: ignore[attr-defined]
    monkeypatch.setattr(sampler.ops, "greedy_output", lambda *a: calls.append(1) or native(*a))
    md, logits = _batch(3, torch.float32)
    sampler(md, None, logits, SamplingMetadata.greedy(md.batch_size))
    assert calls == [1]
    sampled = SamplingMetadata.from_lists([0.0] * (md.batch_size - 1) + [0.7], seeds=[1] * md.batch_size)
    sampler(md, None, logits.nan_to_num(), sampled)
    synthetic = RejectionSampler(
        RejectionSamplerConfig(),
        method="synthetic",
        synthetic_acceptance_rates=[0.5] * 8,
        backend=CpuBackend(),
    )
    monkeypatch.setattr(synthetic.ops, "greedy_output", lambda *a: calls.append(2) or native(*a))
    synthetic(md, None, logits, SamplingMetadata.greedy(md.batch_size))
    assert calls == [1]  # a sampled request, synthetic acceptance: the composed ops


def test_bad_inputs_are_refused_by_name() -> None:
    ops = CpuBackend().sampler_ops()
    assert isinstance(ops, CpuSamplerOps)
    logits, ids = torch.zeros(3, 4), torch.tensor([1, 2], dtype=torch.int32)
    rows, bonus, cu = torch.tensor([0, 1]), torch.tensor([2]), torch.tensor([2])
    with pytest.raises(RuntimeError, match=r"logits must be float32 or float64 \[N, V > 0\], got Int"):
        ops.greedy_output(logits.int(), ids, rows, bonus, cu, 2)
    with pytest.raises(RuntimeError, match=r"request 0: drafts 0..2 of 2 \(at most 1\), bonus row 2 of 3"):
        ops.greedy_output(logits, ids, rows, bonus, cu, 1)
    with pytest.raises(RuntimeError, match=r"target row 5 of draft 1 is not a row of 3"):
        ops.greedy_output(logits, ids, torch.tensor([0, 5]), bonus, cu, 2)
