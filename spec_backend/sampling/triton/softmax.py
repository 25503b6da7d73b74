# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""The temperature softmax of logits rows: ``temperature_softmax_kernel`` (one program per row, two
passes over it) and the device functions it shares with the split, verify and fused kernels, so that
every path computes the same float32 values: ``scaled_logits`` (logits / T), ``softmax_stats`` and
``online_sum`` (the online max and sum-exp), ``row_probs`` and ``softmax_store`` (exp(x / T − m) / s),
``row_temperature`` (a greedy row's T <= 0 taken as 1).

The conventions shared by every kernel: the package docstring.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
    "online_sum",
    "row_probs",
    "row_temperature",
    "scaled_logits",
    "softmax_stats",
    "softmax_store",
    "temperature_softmax_kernel",
]
