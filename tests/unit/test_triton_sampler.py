"""The shared triton sampler kernels against the torch reference (``TorchSamplerOps``).

On machines without a GPU the kernels run under ``TRITON_INTERPRET=1`` (set by tests/conftest.py before
triton is imported); grids and vocabularies are kept small because the interpreter costs ~11 ms per
program instance.

Exactness: scans, the hash, argmax and the float64 paths are compared with ``torch.equal``. The
temperature softmax is compared with a tolerance (blocked float32 sums and exp differ from torch's in the
last bit). ``sample_residual`` computes E = −log(u) with triton's ``log``, which may differ from
``torch.log`` in the last bit (about one value in five on CPU), so its exact comparison holds on random
inputs without near-ties of w/E (relative gap > 2^-23), which is what these inputs are; likewise the
end-to-end comparisons (the probabilities feeding them differ in the last bit).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl
from triton_backend import DEVICE, MODES, OnDevice, TritonReferenceBackend, make_sampler

from spec_backend.backends.base import SamplerTuning
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.sampling import SamplingMetadata, SpecDecodeMetadata, rng
from spec_backend.sampling.torch_ops import TorchSamplerOps
from spec_backend.sampling.triton.ops import TritonSamplerOps
from spec_backend.sampling.triton.rng import row_key, vocab_uniform

V = 80  # not a multiple of the tile: exercises the masked tail
TUNING = SamplerTuning(vocab_block=32, max_grid=None, device_uniforms=True)
REF = TorchSamplerOps()
OPS: Any = OnDevice(TritonSamplerOps(TUNING))
CAPPED: Any = OnDevice(TritonSamplerOps(SamplerTuning(vocab_block=32, max_grid=2, device_uniforms=True)))
NO_F64: Any = OnDevice(TritonSamplerOps(SamplerTuning(vocab_block=32, max_grid=3, device_uniforms=False)))
#: rows shared by several programs (triton.split): 5 tiles of 16 in 3 chunks (32, 32, 16); and
#: 3 tiles of 32 in 2 chunks (64, 16) on a capped grid without device float64
SPLIT: Any = OnDevice(TritonSamplerOps(SamplerTuning(vocab_block=16, vocab_splits=3)))
SPLIT_CAPPED: Any = OnDevice(
    TritonSamplerOps(SamplerTuning(vocab_block=32, max_grid=2, device_uniforms=False, vocab_splits=2))
)
SEEDS = [0, 1, 7, 2**31 - 1, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 3, 2**62 + 12345, 2**63 - 1]


class Batch:
    """A random verification batch: ``ks`` drafts per request, drafts drawn near the target."""

    def __init__(self, ks: list[int], seed: int = 0, vocab: int = V, mix: float = 0.5) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ks = ks
        batch, total = len(ks), sum(ks)
        self.cu = torch.cumsum(torch.tensor(ks, dtype=torch.int64), 0).to(torch.int32)  # [B]
        target, bonus, row = [], [], 0
        for k in ks:
            target += list(range(row, row + k))
            bonus.append(row + k)
            row += k + 1
        self.target_rows = torch.tensor(target, dtype=torch.int64)  # [T]
        self.bonus_rows = torch.tensor(bonus, dtype=torch.int64)  # [B]
        self.logits = torch.randn(total + batch, vocab, generator=gen) * 3  # [N, V]
        self.probs = torch.softmax(self.logits, dim=-1)  # [N, V]
        noise = torch.softmax(torch.randn(total, vocab, generator=gen) * 3, dim=-1)
        self.draft_probs = mix * self.probs[self.target_rows] + (1 - mix) * noise  # [T, V] overlapping q
        self.draft_ids = torch.multinomial(self.draft_probs, 1, generator=gen).squeeze(1).to(torch.int32)
        req = torch.repeat_interleave(torch.arange(batch), torch.tensor(ks))  # [T]
        slot = torch.arange(total) - (self.cu.to(torch.int64) - torch.tensor(ks))[req]  # [T]
        self.seeds = torch.tensor([SEEDS[i % len(SEEDS)] for i in range(batch)], dtype=torch.int64)
        self.positions = torch.randint(0, 2**34, (batch,), generator=gen)
        self.uniforms = rng.uniform_f64(self.seeds[req], self.positions[req], slot, rng.STREAM_ACCEPT)  # [T]
        self.thresholds = torch.rand(total, generator=gen, dtype=torch.float64) * 0.5 + 0.5  # [T]
        self.max_spec_len = max(ks, default=0)

    def verify_args(self, with_q: bool, with_thr: bool) -> tuple[object, ...]:
        return (
            self.draft_ids,
            self.draft_probs if with_q else None,
            self.probs,
            self.target_rows,
            self.uniforms,
            self.thresholds if with_thr else None,
            self.cu,
            self.max_spec_len,
        )


BATCHES = {"mixed": [3, 0, 8, 1, 5, 2], "tiny": [1], "empty": [0, 0], "long": [8, 8]}


def test_vocab_noise_hash_is_bit_exact() -> None:
    @triton.jit  # type: ignore[untyped-decorator]
    def noise_kernel(seed_ptr, pos_ptr, out_ptr, V: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        r = tl.program_id(0)
        key = row_key(tl.load(seed_ptr + r), tl.load(pos_ptr + r), rng.STREAM_SAMPLE)
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + r * V + offs, vocab_uniform(key, offs), mask=offs < V)

    seeds = torch.tensor(SEEDS, dtype=torch.int64)
    positions = torch.tensor([0, 1, -1, 2**32 - 1, 2**32 + 9, 123456789, 5, 2**40, 17, 3], dtype=torch.int64)
    out = torch.empty(len(SEEDS), 100, device=DEVICE)
    noise_kernel[(len(SEEDS),)](seeds.to(DEVICE), positions.to(DEVICE), out, V=100, BLOCK=128)
    assert torch.equal(out.cpu(), rng.vocab_uniform_f32(seeds, positions, 100, rng.STREAM_SAMPLE))


@pytest.mark.parametrize("stream", [rng.STREAM_ACCEPT, rng.STREAM_SYNTHETIC])
def test_uniforms_bit_exact(stream: int) -> None:
    gen = torch.Generator().manual_seed(stream)
    seeds = torch.tensor(SEEDS * 30, dtype=torch.int64)  # 300 values, 2 blocks of 256
    positions = torch.randint(-(2**40), 2**40, seeds.shape, generator=gen)
    counters = torch.randint(0, 2**33, seeds.shape, generator=gen)
    expected = rng.uniform_f64(seeds, positions, counters, stream)
    assert torch.equal(OPS.uniforms(seeds, positions, counters, stream), expected)
    assert torch.equal(CAPPED.uniforms(seeds, positions, counters, stream), expected)
    assert torch.equal(NO_F64.uniforms(seeds, positions, counters, stream), expected)  # torch rng


def test_argmax_identical_with_ties_and_dtypes() -> None:
    gen = torch.Generator().manual_seed(1)
    ties = torch.randint(0, 4, (6, V), generator=gen).float()  # many ties: first index wins
    ties[1] = float("-inf")
    ties[2, 50:] = 9.0  # the max first appears in the second tile
    for logits in (ties, torch.randn(5, V, generator=gen).to(torch.bfloat16), ties[:, :32]):
        assert torch.equal(OPS.argmax(logits), REF.argmax(logits))
        assert torch.equal(CAPPED.argmax(logits), REF.argmax(logits))


def test_target_probs_temperature_softmax() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(7, V, generator=gen) * 4
    logits[3, :10] = float("-inf")
    temperature = torch.tensor([0.0, 1.0, 0.5, 1.7, 0.1, 2.0, 1.0])
    top_k, top_p = torch.zeros(7, dtype=torch.int64), torch.ones(7)
    expected = REF.target_probs(logits, temperature, top_k, top_p, False, False)
    for ops in (OPS, CAPPED, SPLIT, SPLIT_CAPPED):
        got = ops.target_probs(logits, temperature, top_k, top_p, False, False)
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-9)
    top_k[1], top_p[2] = 5, 0.7  # delegated to the torch reference on the same device
    for flags in [(True, False), (False, True), (True, True)]:
        got = OPS.target_probs(logits, temperature, top_k, top_p, *flags)
        want = REF.target_probs(logits, temperature, top_k, top_p, *flags)
        if DEVICE.type == "cpu":  # the same torch code on the same device: identical
            assert torch.equal(got, want)
        else:  # torch's CUDA softmax rounds differently from its CPU one
            torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_greedy_verify_and_fused_greedy(name: str) -> None:
    b = Batch(BATCHES[name], seed=3)
    argmax = REF.argmax(b.logits)
    drafts = argmax[b.target_rows].clone().to(torch.int32)  # all accepted, then break some
    drafts[1::4] = (drafts[1::4] + 1) % V
    expected = REF.greedy_verify(drafts, argmax[b.target_rows], b.cu, b.max_spec_len)
    for ops in (OPS, CAPPED):
        assert torch.equal(ops.greedy_verify(drafts, argmax[b.target_rows], b.cu, b.max_spec_len), expected)
        count, token = ops.greedy_sample(b.logits, drafts, b.target_rows, b.bonus_rows, b.cu)
        assert torch.equal(count, expected)
        k = torch.tensor(b.ks, dtype=torch.int64)
        if drafts.numel():
            at = torch.clamp(b.cu.to(torch.int64) - k + expected, max=drafts.numel() - 1)
            final_rows = torch.where(expected >= k, b.bonus_rows, b.target_rows[at])
        else:
            final_rows = b.bonus_rows
        assert torch.equal(token, argmax[final_rows])


@pytest.mark.parametrize(
    ("name", "with_q", "with_thr"), list(itertools.product(sorted(BATCHES), [0, 1], [0, 1]))
)
def test_verify_scans_identical(name: str, with_q: int, with_thr: int) -> None:
    b = Batch(BATCHES[name], seed=4 + with_q)
    args = b.verify_args(bool(with_q), bool(with_thr))
    for ops in (OPS, CAPPED, NO_F64):
        assert torch.equal(ops.standard_verify(*args), REF.standard_verify(*args))  # type: ignore[arg-type]
        assert torch.equal(ops.cumulative_verify(*args), REF.cumulative_verify(*args))  # type: ignore[arg-type]
        tau, weight = ops.block_verify(*args)
        ref_tau, ref_weight = REF.block_verify(*args)  # type: ignore[arg-type]
        assert torch.equal(tau, ref_tau)
        if ops is NO_F64:  # float32 weights
            torch.testing.assert_close(weight, ref_weight, rtol=1e-6, atol=0)
        else:
            assert torch.equal(weight, ref_weight)


def test_block_verify_accepts_beyond_standard() -> None:
    """A batch where block verification's residual pass matters (τ > the standard leading run)."""
    found = False
    for seed in range(6):
        b = Batch([6, 7, 5, 8], seed=10 + seed)
        args = b.verify_args(True, False)
        tau, _ = OPS.block_verify(*args)
        assert torch.equal(tau, REF.block_verify(*args)[0])  # type: ignore[arg-type]
        found |= bool((tau > REF.standard_verify(*args)).any())  # type: ignore[arg-type]
    assert found


def test_synthetic_verify() -> None:
    b = Batch(BATCHES["mixed"], seed=5)
    u = torch.rand(len(b.ks), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rates = torch.tensor([0.9, 0.8, 0.6, 0.5, 0.5, 0.3, 0.2, 0.1, 0.05], dtype=torch.float64)
    expected = REF.synthetic_verify(u, rates, b.cu, b.max_spec_len)
    for ops in (OPS, CAPPED, NO_F64):
        assert torch.equal(ops.synthetic_verify(u, rates, b.cu, b.max_spec_len), expected)


@pytest.mark.parametrize(("name", "with_q"), list(itertools.product(["mixed", "empty"], [0, 1])))
def test_sample_residual_identical(name: str, with_q: int) -> None:
    b = Batch(BATCHES[name], seed=6)
    total = int(b.draft_ids.numel())
    gen = torch.Generator().manual_seed(7)
    rows = 9
    target_rows = torch.randint(0, b.probs.shape[0], (rows,), generator=gen)
    draft_rows = torch.randint(-1, max(total, 1), (rows,), generator=gen) if total else -torch.ones(rows)
    draft_rows = draft_rows.to(torch.int64)
    scale = torch.rand(rows, dtype=torch.float64, generator=gen)
    scale[:3] = 1.0
    seeds = torch.tensor(SEEDS[:rows], dtype=torch.int64)
    positions = torch.randint(0, 2**36, (rows,), generator=gen)
    q = b.draft_probs if with_q else None
    if total and with_q:  # an empty residual (p == q at b = 1): falls back to sampling p
        target_rows[0], draft_rows[0] = b.target_rows[2], 2
        q = b.draft_probs.clone()
        q[2] = b.probs[b.target_rows[2]]
    args = (b.probs, target_rows, q, b.draft_ids, draft_rows, scale, seeds, positions)
    expected = REF.sample_residual(*args)
    for ops in (OPS, CAPPED, NO_F64, SPLIT, SPLIT_CAPPED):
        assert torch.equal(ops.sample_residual(*args), expected)


# --------------------------------------------------------------------------- end to end
@pytest.mark.parametrize(("mode", "with_q"), list(itertools.product(sorted(MODES), [0, 1])))
def test_rejection_sampler_end_to_end(mode: str, with_q: int) -> None:
    ks = [4, 2, 8, 1, 0] if with_q else [3, 0, 1, 5, 8]
    b = Batch(ks, seed=8 + with_q, mix=0.95)
    drafts = [d.tolist() for d in torch.split(b.draft_ids, ks)]
    argmax = torch.split(REF.argmax(b.logits)[b.target_rows], ks)
    drafts[0], drafts[3] = argmax[0].tolist()[:-1] + drafts[0][-1:], argmax[3].tolist()  # greedy rows
    md = SpecDecodeMetadata.from_draft_tokens(drafts)
    sampling = SamplingMetadata.from_lists(
        [0.0, 1.0, 1.0, 0.0, 1.0], seeds=[3, 11, 2**40, 5, 2**63 - 1], positions=[0, 7, 2**33, 12, 99]
    )
    dprobs = b.draft_probs if with_q else None
    expected = make_sampler(mode, ReferenceBackend())(md, dprobs, b.logits, sampling)
    got = make_sampler(mode, TritonReferenceBackend(TUNING))(md, dprobs, b.logits, sampling)
    assert torch.equal(got, expected)


@pytest.mark.parametrize(
    "tuning",
    [SamplerTuning(64, 2, True), SamplerTuning(16, 3, False), SamplerTuning(16, None, True, vocab_splits=4)],
)
def test_rejection_sampler_capped_grid_and_top_k_top_p(tuning: SamplerTuning) -> None:
    ks = [4, 0, 6, 2]
    b = Batch(ks, seed=12)
    md = SpecDecodeMetadata.from_draft_tokens([d.tolist() for d in torch.split(b.draft_ids, ks)])
    sampling = SamplingMetadata.from_lists(
        [1.0, 0.0, 0.7, 1.2], top_k=[5, 0, 0, 20], top_p=[1.0, 1.0, 0.8, 0.9], seeds=[1, 2, 3, 4]
    )
    for mode in ("standard", "block-lossless"):
        expected = make_sampler(mode, ReferenceBackend())(md, b.draft_probs, b.logits, sampling)
        got = make_sampler(mode, TritonReferenceBackend(tuning))(md, b.draft_probs, b.logits, sampling)
        assert torch.equal(got, expected)


def test_tuning_is_validated() -> None:
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="vocab_splits must be an int >= 1"):
            SamplerTuning(vocab_splits=bad)  # type: ignore[arg-type]
    for tile in (0, 48, 1.0, True):
        with pytest.raises(ValueError, match=f"fused_block must be None or a power of two >= 1, got {tile}"):
            SamplerTuning(fused_block=tile)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="power of two"):
        TritonSamplerOps(SamplerTuning(vocab_block=100))
    with pytest.raises(ValueError, match="max_grid"):
        TritonSamplerOps(SamplerTuning(max_grid=0))


@pytest.mark.parametrize(
    ("vocab", "splits", "block"), [(80, 3, 16), (80, 2, 32), (80, 9, 16), (151936, 32, 1024)]
)
def test_split_plan_covers_the_row_with_non_empty_chunks(vocab: int, splits: int, block: int) -> None:
    from spec_backend.sampling.triton.split import split_plan

    used, chunk, block_s = split_plan(vocab, splits, block)
    assert 1 <= used <= splits and chunk % block == 0
    assert (used - 1) * chunk < vocab <= used * chunk  # every chunk holds ids, together all of them
    assert block_s >= used and block_s & (block_s - 1) == 0
