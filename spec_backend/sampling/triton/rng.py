# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""The counter-based random numbers on the device: the hash of ``spec_backend.sampling.rng`` in
``tl.uint32`` arithmetic, bit-exact (uint32 multiplications wrap, ``>>`` is logical): ``mix32``,
``absorb``, ``row_key`` and ``random_u32``; the float32 uniform of each vocabulary id that the residual
race draws (``vocab_uniform``); the float64 acceptance uniforms (``uniform_f64``, ``uniforms_kernel``).

``rng.X`` in the docstrings and comments below is ``spec_backend.sampling.rng.X``, the torch counterpart.
The conventions shared by every kernel: the package docstring.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: 2^-24 and 2^-53, the scales of ``rng.vocab_uniform_f32`` and ``rng.uniform_f64`` (constexpr: jit code
#: may only read constexpr globals)
TWO_POW_M24 = tl.constexpr(2.0**-24)
TWO_POW_M53 = tl.constexpr(2.0**-53)


# ----------------------------------------------------------------------- the hash (sampling/rng.py in uint32)
@triton.jit
def mix32(x):  # uint32 -> uint32, the bijective finaliser of rng.mix32
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x68E31DA5
    return x ^ (x >> 16)


@triton.jit
def absorb(key, word):  # uint32, uint32 -> uint32
    return mix32((key ^ word) + 0x9E3779B9)


@triton.jit
def row_key(seed, position, STREAM: tl.constexpr):  # int64 seed >= 0, int64 position -> uint32
    """``rng.row_key``: absorb seed low word, seed high word, position (mod 2^32) into the stream id."""
    lo = seed.to(tl.int64).to(tl.uint32)  # truncation == seed & MASK32
    hi = (seed.to(tl.int64) >> 32).to(tl.uint32)
    key = mix32((lo ^ STREAM) + 0x9E3779B9)  # absorb(STREAM, lo)
    key = absorb(key, hi)
    return absorb(key, position.to(tl.int64).to(tl.uint32))


@triton.jit
def random_u32(key, index):  # uint32 key, int index -> uint32 (index taken mod 2^32)
    return mix32(absorb(key, index.to(tl.uint32)))


@triton.jit
def vocab_uniform(key, vocab):  # uint32 key, int32 [BLOCK_V] -> float32 [BLOCK_V] in (0, 1)
    """``rng.vocab_uniform_f32`` for a block of vocabulary ids: (2 * (h >> 9) + 1) * 2^-24, exact."""
    h = random_u32(key, vocab)
    return ((h >> 9) * 2 + 1).to(tl.float32) * TWO_POW_M24


# --------------------------------------------------------------------------- uniforms
@triton.jit
def uniform_f64(seed, position, counter, STREAM: tl.constexpr):  # int64s -> float64 in [0, 1)
    """``rng.uniform_f64``: 27 + 26 random bits of two hashed words, exact in float64."""
    key = row_key(seed, position, STREAM)
    hi = (random_u32(key, 2 * counter) >> 5).to(tl.int64)  # 27 bits
    lo = (random_u32(key, 2 * counter + 1) >> 6).to(tl.int64)  # 26 bits
    return ((hi << 26) | lo).to(tl.float64) * TWO_POW_M53


@triton.jit
def uniforms_kernel(
    seed_ptr,  # [M] int64
    pos_ptr,  # [M] int
    ctr_ptr,  # [M] int
    out_ptr,  # [M] float64
    M,
    STREAM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``rng.uniform_f64``. Grid: min(cdiv(M, BLOCK), max_grid) programs, each looping over blocks of
    BLOCK elements. Traffic: 32 bytes per element. Needs float64 on the device (CUDA only: Ascend
    backends set ``device_uniforms=False`` and the uniforms come from torch)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for start in tl.range(pid * BLOCK, M, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < M
        seed = tl.load(seed_ptr + offs, mask=mask, other=0).to(tl.int64)
        pos = tl.load(pos_ptr + offs, mask=mask, other=0).to(tl.int64)
        ctr = tl.load(ctr_ptr + offs, mask=mask, other=0).to(tl.int64)
        tl.store(out_ptr + offs, uniform_f64(seed, pos, ctr, STREAM), mask=mask)


__all__ = [
    "absorb",
    "mix32",
    "random_u32",
    "row_key",
    "uniform_f64",
    "uniforms_kernel",
    "vocab_uniform",
]
