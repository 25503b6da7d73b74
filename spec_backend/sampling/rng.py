"""Counter-based random numbers: a stateless integer hash keyed by (seed, position, stream, index).

Every random number the rejection sampler uses is a pure function of four integers, so a seeded request
draws the same numbers whatever else is in the batch, nothing loops over Python generators, and nothing
waits on the host. The hash is written with int64 torch ops that emulate **uint32** arithmetic exactly:

* every intermediate value lies in [0, 2^32) (``& MASK32`` after each add / multiply);
* multiplications are by odd constants below 2^31, so a product of a 32-bit value and a constant stays
  below 2^63 and fits int64; ``(x * C) & MASK32`` is then the wrapped uint32 product;
* ``>>`` is applied to non-negative values only, so it is the logical uint32 shift.

A triton kernel reproduces it bit-exactly with ``tl.uint32`` values and plain ``*``, ``+``, ``^``, ``>>``
(``spec_backend.sampling.triton.rng``).

Definition (all values uint32)::

    mix32(x):        x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x68E31DA5; x ^= x >> 16
    absorb(k, w):    mix32((k ^ w) + 0x9E3779B9)
    row_key(seed, position, stream):
        k = absorb(stream, seed & 0xFFFFFFFF)
        k = absorb(k, (seed >> 32) & 0xFFFFFFFF)      # seed: 63-bit non-negative int64
        k = absorb(k, position & 0xFFFFFFFF)          # position taken modulo 2^32
    random_u32(key, index) = mix32(absorb(key, index & 0xFFFFFFFF))

Derived numbers:

* float64 uniform in [0, 1) (acceptance tests): words a = random_u32(key, 2c), b = random_u32(key, 2c+1),
  u = ((a >> 5) * 2^26 + (b >> 6)) * 2^-53  — 53 random bits, exact in float64;
* float32 uniform in (0, 1) (per-vocabulary noise): h = random_u32(key, v),
  u = (2 * (h >> 9) + 1) * 2^-24 — 23 random bits plus a fixed low bit, exact in float32, never 0 or 1.

Streams separate independent uses of the same (seed, position): see ``STREAM_*``.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
MIX_MUL_1 = 0x7FEB352D
MIX_MUL_2 = 0x68E31DA5
GOLDEN = 0x9E3779B9

#: acceptance uniforms of one verification step, keyed by the step's first draft position
STREAM_ACCEPT = 1
#: per-vocabulary noise of the recovered / bonus token, keyed by the emitted token's absolute position
STREAM_SAMPLE = 2
#: the single per-request uniform of the synthetic acceptance mode
STREAM_SYNTHETIC = 3
#: per-vocabulary noise of a sampled draft token, keyed by that draft's absolute position
STREAM_DRAFT = 4
#: token-tree verification: one uniform per node, then the final token's, keyed by the first node's position
STREAM_TREE = 5

#: largest seed drawn for unseeded requests (63 bits, non-negative int64)
MAX_SEED = 2**63 - 1


def mix32(x: torch.Tensor) -> torch.Tensor:
    """Bijective 32-bit finalizer on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * MIX_MUL_1) & MASK32
    x = x ^ (x >> 15)
    x = (x * MIX_MUL_2) & MASK32
    return x ^ (x >> 16)


def absorb(key: torch.Tensor, word: torch.Tensor | int) -> torch.Tensor:
    """Fold one 32-bit word into a 32-bit key."""
    return mix32(((key ^ word) + GOLDEN) & MASK32)


def row_key(seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """Key of each (seed, position, stream): ``seeds`` [N] int64 >= 0, ``positions`` [N] -> [N] int64."""
    key = torch.full_like(seeds, stream & MASK32, dtype=torch.int64)
    key = absorb(key, seeds & MASK32)
    key = absorb(key, (seeds >> 32) & MASK32)
    return absorb(key, positions.to(torch.int64) & MASK32)


def random_u32(key: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """uint32 values (as int64) for broadcast ``key`` and ``index``; e.g. key [N, 1], index [V] -> [N, V]."""
    return mix32(absorb(key, index & MASK32))


def uniform_f64(
    seeds: torch.Tensor, positions: torch.Tensor, counters: torch.Tensor, stream: int
) -> torch.Tensor:
    """float64 uniforms in [0, 1) with 53 random bits: all arguments [N] int64 -> [N] float64."""
    key = row_key(seeds, positions, stream)  # [N]
    counters = counters.to(torch.int64)
    hi = random_u32(key, 2 * counters) >> 5  # [N] 27 bits
    lo = random_u32(key, 2 * counters + 1) >> 6  # [N] 26 bits
    return ((hi << 26) | lo).to(torch.float64) * (2.0**-53)


def vocab_uniform_f32(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, stream: int
) -> torch.Tensor:
    """float32 uniforms in (0, 1), one per vocabulary entry: ``seeds``/``positions`` [N] -> [N, V]."""
    key = row_key(seeds, positions, stream)[:, None]  # [N, 1]
    vocab = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)  # [V]
    h = random_u32(key, vocab)  # [N, V]
    return (2 * (h >> 9) + 1).to(torch.float32) * (2.0**-24)


def vocab_uniform_f32_into(
    key: torch.Tensor, start: int, out: torch.Tensor, scratch: torch.Tensor
) -> torch.Tensor:
    """``vocab_uniform_f32`` for the columns ``start : start + C``, computed in place (no allocation).

    ``key`` [N, 1] int64 (``row_key``), ``out`` [N, C] int64 and ``scratch`` [N, C] int64 are reused
    buffers; returns a float32 [N, C] view of the same values ``vocab_uniform_f32`` gives there. The
    engine's CPU path calls it on cache-sized tiles, which is several times faster than hashing ``[N, V]``
    at once (every op of the hash would otherwise allocate and stream a fresh ``[N, V]`` int64 tensor).
    """
    out.copy_(torch.arange(start, start + out.shape[1], device=out.device, dtype=torch.int64))  # [N, C] v
    out.bitwise_xor_(key).add_(GOLDEN).bitwise_and_(MASK32)  # absorb(key, v) before its mix
    _mix32_(out, scratch)
    _mix32_(out, scratch)  # random_u32 = mix32(absorb(...))
    out.bitwise_right_shift_(9).mul_(2).add_(1)
    return out.to(torch.float32).mul_(2.0**-24)


def _mix32_(x: torch.Tensor, tmp: torch.Tensor) -> None:
    """``mix32`` in place on ``x``, with ``tmp`` (same shape) as scratch."""
    for shift, mul in ((16, MIX_MUL_1), (15, MIX_MUL_2)):
        torch.bitwise_right_shift(x, shift, out=tmp)
        x.bitwise_xor_(tmp).mul_(mul).bitwise_and_(MASK32)
    torch.bitwise_right_shift(x, 16, out=tmp)
    x.bitwise_xor_(tmp)


def random_seeds(batch_size: int, device: torch.device) -> torch.Tensor:
    """Fresh 63-bit seeds from torch's global generator, drawn on ``device`` (no host sync): [B] int64."""
    return torch.randint(0, MAX_SEED, (batch_size,), dtype=torch.int64, device=device)


__all__ = [
    "GOLDEN",
    "MASK32",
    "MAX_SEED",
    "MIX_MUL_1",
    "MIX_MUL_2",
    "STREAM_ACCEPT",
    "STREAM_SAMPLE",
    "STREAM_SYNTHETIC",
    "absorb",
    "mix32",
    "random_seeds",
    "random_u32",
    "row_key",
    "uniform_f64",
    "vocab_uniform_f32",
    "vocab_uniform_f32_into",
]
