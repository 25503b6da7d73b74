# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""The row-wide kernels (temperature softmax, residual race) with each row split over several programs
(``SamplerTuning.vocab_splits`` > 1), and ``split_plan``, the host-side chunking of a row.

Why: the one-program-per-row kernels (``temperature_softmax_kernel``, ``sample_residual_kernel``) walk a
whole vocabulary row in one program. With few rows (a small batch) only a few programs run, each
latency-bound: measured on an H100 at V = 151936, B = 1, K = 4, the two kernels took 184 and 224 µs per
call against a bandwidth floor of 1 µs (docs/benchmarks.md, "CUDA (H100)"). Here ``splits`` programs
share a row, each over one contiguous *chunk* of ``chunk`` elements (a multiple of ``BLOCK_V``), and a
second small kernel combines the per-chunk partial results in chunk order.

Exactness: the residual race takes, per chunk, the same per-element keys and the same first-index
maximum as the unsplit kernel; the combine takes the first chunk among equal maxima, so the sampled
token is the unsplit kernel's, bit for bit. The softmax's row sum is reduced per chunk and then over the
chunks: its float32 rounding may differ from the unsplit kernel's in the last bit (as both may from
torch's), the probabilities by ~1e-7 relative.

Grids are persistent-style over *work items* ``row * splits + chunk`` (and over rows for the combines),
so a capped grid (``SamplerTuning.max_grid``) gives identical results.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_backend.sampling.triton.softmax import row_temperature, softmax_stats, softmax_store
from spec_backend.sampling.triton.verify import residual_races


# --------------------------------------------------------------------------- temperature softmax
@triton.jit
def softmax_partials_kernel(
    logits_ptr,  # [N, V] float
    l_stride,
    temp_ptr,  # [N] float (<= 0: greedy row, treated as 1)
    max_ptr,  # [N * splits] float32 out: chunk max of logits / T
    sum_ptr,  # [N * splits] float32 out: chunk sum of exp(x - chunk max)
    N,
    V,
    splits,
    chunk,
    BLOCK_V: tl.constexpr,
):
    """Pass 1: each work item's online (max, sum-exp) over its chunk of one row."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for item in tl.range(pid, N * splits, nprog):
        row = item // splits
        start = (item % splits) * chunk
        src = logits_ptr + tl.cast(row, tl.int64) * l_stride
        t = row_temperature(temp_ptr, row)
        m, s = softmax_stats(src, t, start, tl.minimum(start + chunk, V), V, BLOCK_V)
        tl.store(max_ptr + item, m)
        tl.store(sum_ptr + item, s)


@triton.jit
def softmax_normalise_kernel(
    logits_ptr,  # [N, V] float
    l_stride,
    temp_ptr,  # [N] float
    max_ptr,  # [N * splits] float32 chunk maxima
    sum_ptr,  # [N * splits] float32 chunk sums
    out_ptr,  # [N, V] float32
    o_stride,
    N,
    V,
    splits,
    chunk,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,  # next power of two >= splits
):
    """Pass 2: combine the row's chunk statistics (in chunk order), then write this chunk's
    probabilities exp(x − max) / sum."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    parts = tl.arange(0, BLOCK_S)
    for item in tl.range(pid, N * splits, nprog):
        row = item // splits
        start = (item % splits) * chunk
        pm = tl.load(max_ptr + row * splits + parts, mask=parts < splits, other=float("-inf"))
        ps = tl.load(sum_ptr + row * splits + parts, mask=parts < splits, other=0.0)
        m, s = combine_stats(pm, ps)
        src = logits_ptr + tl.cast(row, tl.int64) * l_stride
        dst = out_ptr + tl.cast(row, tl.int64) * o_stride
        t = row_temperature(temp_ptr, row)
        softmax_store(src, dst, t, m, s, start, tl.minimum(start + chunk, V), V, BLOCK_V)


@triton.jit
def combine_stats(pm, ps):  # chunk maxima, chunk sums [BLOCK_S] (-inf / 0 past the chunks) -> (max, sum)
    """A row's (max, sum-exp) from its chunks', reduced in one fixed order (the same S wherever used)."""
    m = tl.max(pm, axis=0)
    return m, tl.sum(tl.where(pm == float("-inf"), 0.0, ps * tl.exp(pm - m)), axis=0)


# --------------------------------------------------------------------------- residual sampling
@triton.jit
def residual_partials_kernel(
    tprobs_ptr,  # [N, V] float32
    tp_stride,
    trow_ptr,  # [R] int
    dprobs_ptr,  # [T, V] float (unused without HAS_Q)
    dp_stride,
    draft_ptr,  # [T] int (unused without HAS_DRAFTS)
    drow_ptr,  # [R] int, -1: no draft
    scale_ptr,  # [R] float32 weight b
    seed_ptr,  # [R] int64
    pos_ptr,  # [R] int64
    part_key_ptr,  # [R * splits, 2] float32 out: best w/E and best p/E of the chunk
    part_idx_ptr,  # [R * splits, 2] int32 out: their first indices
    part_any_ptr,  # [R * splits] int32 out: any w > 0 in the chunk
    stats_ptr,  # [3, R] float32 with FROM_LOGITS (see residual_races), else unread
    R,
    V,
    splits,
    chunk,
    HAS_DRAFTS: tl.constexpr,
    HAS_Q: tl.constexpr,
    STREAM: tl.constexpr,
    BLOCK_V: tl.constexpr,
    FROM_LOGITS: tl.constexpr,
):
    """``sample_residual_kernel``'s two exponential races over one chunk of one output row; with
    ``FROM_LOGITS`` the probabilities are made from the logits and the row statistics on the fly
    (``triton.fused``)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for item in tl.range(pid, R * splits, nprog):
        r = item // splits
        start = (item % splits) * chunk
        w_any, best_w, idx_w, best_p, idx_p = residual_races(
            tprobs_ptr, tp_stride, trow_ptr, dprobs_ptr, dp_stride, draft_ptr, drow_ptr, scale_ptr,
            seed_ptr, pos_ptr, r, start, tl.minimum(start + chunk, V), V, stats_ptr, HAS_DRAFTS, HAS_Q,
            STREAM, BLOCK_V, FROM_LOGITS, R,
        )  # fmt: skip
        tl.store(part_key_ptr + 2 * item, best_w)
        tl.store(part_key_ptr + 2 * item + 1, best_p)
        tl.store(part_idx_ptr + 2 * item, idx_w)
        tl.store(part_idx_ptr + 2 * item + 1, idx_p)
        tl.store(part_any_ptr + item, w_any.to(tl.int32))


@triton.jit
def residual_combine_kernel(
    part_key_ptr,  # [R * splits, 2] float32
    part_idx_ptr,  # [R * splits, 2] int32
    part_any_ptr,  # [R * splits] int32
    out_ptr,  # [R] int64
    R,
    splits,
    BLOCK_S: tl.constexpr,  # next power of two >= splits
):
    """Per output row: ``combined_race``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for r in tl.range(pid, R, nprog):
        tl.store(out_ptr + r, combined_race(part_key_ptr, part_idx_ptr, part_any_ptr, r, splits, BLOCK_S))


@triton.jit
def combined_race(part_key_ptr, part_idx_ptr, part_any_ptr, r, splits, BLOCK_S: tl.constexpr):
    """Output row r's token from its chunks' races: the first chunk holding the row's largest key wins
    (the unsplit kernel's first index); the w race when any chunk had w > 0, else the p race."""
    parts = tl.arange(0, BLOCK_S)
    items = r * splits + parts
    ok = parts < splits
    kw = tl.load(part_key_ptr + 2 * items, mask=ok, other=-2.0)
    kp = tl.load(part_key_ptr + 2 * items + 1, mask=ok, other=-2.0)
    w_any = tl.max(tl.load(part_any_ptr + items, mask=ok, other=0), axis=0) > 0
    _, cw = tl.max(kw, axis=0, return_indices=True, return_indices_tie_break_left=True)
    _, cp = tl.max(kp, axis=0, return_indices=True, return_indices_tie_break_left=True)
    iw = tl.load(part_idx_ptr + 2 * (r * splits + cw))
    ip = tl.load(part_idx_ptr + 2 * (r * splits + cp) + 1)
    return tl.where(w_any, iw, ip).to(tl.int64)


def split_plan(vocab: int, splits: int, block: int) -> tuple[int, int, int]:
    """(splits actually used, chunk elements per split — a multiple of ``block`` —, next power of two
    >= splits) for a row of ``vocab``: never more splits than the row has tiles."""
    tiles = triton.cdiv(vocab, block)
    used = max(1, min(splits, tiles))
    chunk = triton.cdiv(tiles, used) * block
    used = triton.cdiv(vocab, chunk)  # every chunk non-empty
    return used, chunk, triton.next_power_of_2(used)


__all__ = [
    "combine_stats",
    "combined_race",
    "residual_combine_kernel",
    "residual_partials_kernel",
    "softmax_normalise_kernel",
    "softmax_partials_kernel",
    "split_plan",
]
