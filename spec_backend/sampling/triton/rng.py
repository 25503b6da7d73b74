# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""Shared triton kernels of the rejection sampler (CUDA and Ascend), part 1: the counter-based hash,
uniforms, argmax, greedy verification and the temperature softmax.

One source for every backend: tile sizes (``BLOCK_V`` = ``SamplerTuning.vocab_block``) are constexpr
arguments and grids are capped by ``SamplerTuning.max_grid``. Every kernel is *persistent-style*: program
``pid`` of ``nprog`` handles rows ``pid, pid + nprog, ...``, so any grid size >= 1 gives the same result.
No kernel reads anything back to the host, so the callers are graph-capturable.

Exactness conventions (shared with ``triton.verify``):

* the hash is the uint32 arithmetic of ``spec_backend.sampling.rng``, bit-exact (``tl.uint32``
  multiplications wrap, ``>>`` is logical);
* divisions use ``tl.math.div_rn`` (IEEE round-to-nearest; CUDA's default f32 ``/`` is approximate);
  launches pass ``enable_fp_fusion=False`` so that ``b * p - q`` is not contracted into an FMA, which
  would round differently from the torch reference;
* reductions (sums over the vocabulary) are blocked, so their float32 rounding may differ from torch's
  in the last bit: only the *sums* differ (the residual mass, the softmax normaliser), never a scan.

Conventions: N logits rows, V vocabulary, T drafts, B requests; ``tl.cast(row, tl.int64) * stride`` keeps
element offsets 64-bit (N * V exceeds 2^31 for large batches of 150k vocabularies).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: 2^-24 and 2^-53, the scales of ``rng.vocab_uniform_f32`` and ``rng.uniform_f64`` (constexpr: jit code
#: may only read constexpr globals)
TWO_POW_M24 = tl.constexpr(2.0**-24)
TWO_POW_M53 = tl.constexpr(2.0**-53)


# --------------------------------------------------------------------------- the hash (rng.py in uint32)
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


@triton.jit
def request_span(cu_ptr, b):  # -> (first draft index, number of drafts) of request b, int64
    end = tl.load(cu_ptr + b).to(tl.int64)
    prev = tl.load(cu_ptr + b - 1, mask=b > 0, other=0).to(tl.int64)
    return prev, end - prev


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


# --------------------------------------------------------------------------- argmax / greedy
@triton.jit
def row_argmax(row_ptr, V, BLOCK_V: tl.constexpr):  # one row of V logits -> int32 first index of max
    best = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.zeros([], tl.int32)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m, i = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        take = m > best  # strict: the earlier block keeps ties (torch.argmax's first index)
        best_idx = tl.where(take, v0 + i, best_idx)
        best = tl.where(take, m, best)
    return best_idx


@triton.jit
def argmax_kernel(
    logits_ptr,  # [N, V] float (any)
    stride,
    out_ptr,  # [N] int64
    N,
    V,
    BLOCK_V: tl.constexpr,
):
    """Row argmax. Grid: min(N, max_grid) programs, persistent over rows; each row is read once in
    blocks of BLOCK_V (running max + first index). Traffic: N * V * elem bytes (the floor)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for row in tl.range(pid, N, nprog):
        idx = row_argmax(logits_ptr + tl.cast(row, tl.int64) * stride, V, BLOCK_V)
        tl.store(out_ptr + row, idx.to(tl.int64))


@triton.jit
def greedy_verify_kernel(
    draft_ptr,  # [T] int
    amax_ptr,  # [T] int, argmax of each draft's target row
    cu_ptr,  # [B] int, inclusive cumsum of draft counts
    out_ptr,  # [B] int64 accepted drafts
    B,
):
    """Leading run of draft == argmax. Grid: min(B, max_grid), persistent over requests; one program
    scans its request's slots. Traffic: 16 bytes per draft."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for b in tl.range(pid, B, nprog):
        start, n = request_span(cu_ptr, b)
        count = tl.zeros([], tl.int64)
        alive = tl.full([], 1, tl.int1)
        for j in range(0, n):
            x = tl.load(draft_ptr + start + j).to(tl.int64)
            a = tl.load(amax_ptr + start + j).to(tl.int64)
            alive = alive & (x == a)
            count += alive.to(tl.int64)
        tl.store(out_ptr + b, count)


@triton.jit
def greedy_fused_kernel(
    logits_ptr,  # [N, V] float raw logits
    stride,
    draft_ptr,  # [T] int
    trow_ptr,  # [T] int, logits row of each draft
    brow_ptr,  # [B] int, bonus row of each request
    cu_ptr,  # [B] int
    count_ptr,  # [B] int64 out: accepted drafts
    token_ptr,  # [B] int64 out: recovered / bonus token (argmax of the first rejected or bonus row)
    B,
    V,
    BLOCK_V: tl.constexpr,
):
    """Greedy verification fused with the argmax: one program per request (persistent when capped)
    walks its rows in order, computing each row's argmax in BLOCK_V blocks, and stops at the first
    mismatch, whose argmax is the emitted token. Traffic: only rows 0..n (accepted + 1) of each request
    are read: at most the floor (all K+1 rows read once), less when drafts are rejected early."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for b in tl.range(pid, B, nprog):
        start, n = request_span(cu_ptr, b)
        count = tl.zeros([], tl.int64)
        token = tl.zeros([], tl.int64)
        alive = tl.full([], 1, tl.int1)
        for j in range(0, n + 1):
            if alive:
                is_draft = j < n
                t = tl.minimum(start + j, start + n - 1)  # clamped: only read when is_draft
                row = tl.where(
                    is_draft,
                    tl.load(trow_ptr + t, mask=is_draft, other=0).to(tl.int64),
                    tl.load(brow_ptr + b).to(tl.int64),
                )
                a = row_argmax(logits_ptr + row * stride, V, BLOCK_V).to(tl.int64)
                x = tl.load(draft_ptr + t, mask=is_draft, other=-1).to(tl.int64)
                ok = is_draft & (x == a)
                count += ok.to(tl.int64)
                token = tl.where(ok, token, a)
                alive = ok
        tl.store(count_ptr + b, count)
        tl.store(token_ptr + b, token)


# --------------------------------------------------------------------------- temperature softmax
@triton.jit
def softmax_stats(src, t, start, end, V, BLOCK_V: tl.constexpr):  # -> (max, sum exp(x - max)) of x / t
    """Online (max, sum-exp) of logits / t over vocabulary ids [start, end) of one row."""
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for v0 in range(start, end, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        x = scaled_logits(src, offs, offs < V, t)
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = online_sum(s, m, new_m, x)
        m = new_m
    return m, s


@triton.jit
def online_sum(s, m, new_m, x):  # -> the running sum-exp after one block x, the max moving m -> new_m
    e = tl.where(x == float("-inf"), 0.0, tl.exp(x - new_m))
    return s * tl.where(m == new_m, 1.0, tl.exp(m - new_m)) + tl.sum(e, axis=0)


@triton.jit
def softmax_store(src, dst, t, m, s, start, end, V, BLOCK_V: tl.constexpr):
    """Write exp(x / t − m) / s for vocabulary ids [start, end) of one row."""
    for v0 in range(start, end, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        tl.store(dst + offs, row_probs(src, offs, offs < V, t, m, s), mask=offs < V)


@triton.jit
def scaled_logits(src, offs, mask, t):  # -> float32 logits / t (-inf where masked); t = 1 skips the divide
    z = tl.load(src + offs, mask=mask, other=float("-inf")).to(tl.float32)
    if t != 1.0:  # div_rn(z, 1) == z: the same values, without the IEEE division's cost
        z = tl.math.div_rn(z, t)
    return z


@triton.jit
def row_probs(src, offs, mask, t, m, s):  # -> float32 exp(x / t − m) / s, ``softmax_store``'s values
    z = scaled_logits(src, offs, mask, t)
    return tl.math.div_rn(tl.where(z == float("-inf"), 0.0, tl.exp(z - m)), s)


@triton.jit
def row_temperature(temp_ptr, row):  # -> float32 temperature of the row (<= 0: greedy, treated as 1)
    t = tl.load(temp_ptr + row).to(tl.float32)
    return tl.where(t > 0, t, 1.0)


@triton.jit
def temperature_softmax_kernel(
    logits_ptr,  # [N, V] float
    l_stride,
    temp_ptr,  # [N] float (<= 0: greedy row, treated as 1)
    out_ptr,  # [N, V] float32
    o_stride,
    N,
    V,
    BLOCK_V: tl.constexpr,
):
    """softmax(logits / T) per row. Grid: min(N, max_grid), persistent over rows. Two passes over the
    row: an online (max, sum-exp) pass, then a normalise-and-store pass. Traffic: 2 reads of the
    logits + 1 float32 write (3x the floor for float32 logits, 4x for bf16): the materialised [N, V]
    probabilities are what the ``SamplerOps`` protocol asks for. On CUDA ``tl.exp`` lowers to
    ``ex2.approx`` (a few ulp, denormal results flushed to 0): the probabilities match torch's to ~1e-6
    relative, not bit for bit. With few rows, ``triton.split`` shares each row among programs."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for row in tl.range(pid, N, nprog):
        t = row_temperature(temp_ptr, row)
        src = logits_ptr + tl.cast(row, tl.int64) * l_stride
        m, s = softmax_stats(src, t, 0, V, V, BLOCK_V)
        softmax_store(src, out_ptr + tl.cast(row, tl.int64) * o_stride, t, m, s, 0, V, V, BLOCK_V)


__all__ = [
    "absorb",
    "argmax_kernel",
    "greedy_fused_kernel",
    "greedy_verify_kernel",
    "mix32",
    "online_sum",
    "random_u32",
    "request_span",
    "row_argmax",
    "row_key",
    "row_probs",
    "row_temperature",
    "scaled_logits",
    "softmax_stats",
    "softmax_store",
    "temperature_softmax_kernel",
    "uniform_f64",
    "uniforms_kernel",
    "vocab_uniform",
]
