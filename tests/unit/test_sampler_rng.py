"""rng.py: the counter-based hash emulates uint32 arithmetic exactly, is pinned, and looks uniform."""

from __future__ import annotations

import torch

from spec_backend.sampling import rng

M32 = 0xFFFFFFFF


def _mix32_py(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) % 2**32
    x ^= x >> 15
    x = (x * 0x68E31DA5) % 2**32
    return x ^ (x >> 16)


def _absorb_py(k: int, w: int) -> int:
    return _mix32_py(((k ^ w) + 0x9E3779B9) % 2**32)


def _random_u32_py(seed: int, position: int, stream: int, index: int) -> int:
    k = _absorb_py(stream, seed & M32)
    k = _absorb_py(k, (seed >> 32) & M32)
    k = _absorb_py(k, position & M32)
    return _mix32_py(_absorb_py(k, index & M32))


SEEDS = [0, 1, 12345, 2**63 - 1, 2**40 + 17]
POSITIONS = [0, 7, 1000, 2**40 + 3, 2**32 - 1]


def test_hash_matches_pure_python_uint32() -> None:
    seeds, positions = torch.tensor(SEEDS), torch.tensor(POSITIONS)
    index = torch.tensor([0, 1, 2, 3, M32])
    got = rng.random_u32(rng.row_key(seeds, positions, rng.STREAM_SAMPLE), index).tolist()
    want = [
        _random_u32_py(s, p, rng.STREAM_SAMPLE, i)
        for s, p, i in zip(SEEDS, POSITIONS, index.tolist(), strict=True)
    ]
    assert got == want
    assert all(0 <= v <= M32 for v in got)


def test_hash_values_are_pinned() -> None:
    """Golden values: a triton (uint32) implementation must reproduce these bit-exactly."""
    seeds, positions = torch.tensor(SEEDS[:4]), torch.tensor(POSITIONS[:4])
    assert rng.row_key(seeds, positions, 1).tolist() == [930062542, 309757971, 664700586, 3936247566]
    keys = rng.row_key(seeds, positions, 2)
    assert rng.random_u32(keys, torch.arange(4)).tolist() == [4112493902, 3178275213, 2818379732, 2349390876]
    u = rng.uniform_f64(seeds, positions, torch.arange(4), 1).tolist()
    assert u == [0.9305263553025716, 0.24356951421183215, 0.33784927876838466, 0.44836968193327853]


def test_uniform_f64_is_53_bit_and_uniform() -> None:
    n = 100_000
    u = rng.uniform_f64(torch.full((n,), 5), torch.arange(n), torch.zeros(n, dtype=torch.int64), 1)
    assert u.dtype == torch.float64
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert torch.equal(u * 2**53, torch.floor(u * 2**53))
    counts = torch.histc(u, bins=20, min=0.0, max=1.0)
    chi2 = float(((counts - n / 20) ** 2 / (n / 20)).sum())
    assert chi2 < 60.0  # 19 degrees of freedom: p < 1e-5 above 50


def test_vocab_uniform_f32_open_interval_and_independent_of_batch() -> None:
    seeds, positions = torch.tensor([3, 4]), torch.tensor([9, 9])
    u = rng.vocab_uniform_f32(seeds, positions, 50_000, rng.STREAM_SAMPLE)
    assert u.dtype == torch.float32 and u.shape == (2, 50_000)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    alone = rng.vocab_uniform_f32(seeds[1:], positions[1:], 50_000, rng.STREAM_SAMPLE)
    assert torch.equal(alone[0], u[1])
    lag1 = torch.corrcoef(torch.stack([u[0, :-1], u[0, 1:]]))[0, 1]
    assert abs(float(lag1)) < 0.02


def test_streams_and_positions_decorrelate() -> None:
    seeds, positions, counters = torch.tensor([1]), torch.tensor([0]), torch.tensor([0])
    a = rng.uniform_f64(seeds, positions, counters, rng.STREAM_ACCEPT)
    b = rng.uniform_f64(seeds, positions, counters, rng.STREAM_SYNTHETIC)
    c = rng.uniform_f64(seeds, positions + 1, counters, rng.STREAM_ACCEPT)
    assert len({float(a), float(b), float(c)}) == 3


def test_random_seeds_are_63_bit() -> None:
    s = rng.random_seeds(1000, torch.device("cpu"))
    assert s.dtype == torch.int64 and bool((s >= 0).all())


def test_vocab_uniform_in_place_tiles_equal_the_one_shot_values() -> None:
    seeds, positions = torch.tensor(SEEDS), torch.tensor(POSITIONS)
    want = rng.vocab_uniform_f32(seeds, positions, 1000, rng.STREAM_SAMPLE)  # [5, 1000]
    key = rng.row_key(seeds, positions, rng.STREAM_SAMPLE)[:, None]
    buf, scratch = torch.empty(5, 300, dtype=torch.int64), torch.empty(5, 300, dtype=torch.int64)
    for start in (0, 300, 700):  # the last tile is a narrower (non-contiguous) view of the buffers
        width = min(300, 1000 - start)
        got = rng.vocab_uniform_f32_into(key, start, buf[:, :width], scratch[:, :width])
        assert torch.equal(got, want[:, start : start + width])
