# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""The greedy path of the rejection sampler: the row argmax (``row_argmax``, ``argmax_kernel``: the
first index of the maximum, as ``torch.argmax``), the greedy verification over precomputed argmaxes
(``greedy_verify_kernel``: the leading run of draft == argmax) and the same verification fused with the
argmax (``greedy_fused_kernel``: each request's rows read in order, stopping at the first mismatch).

The conventions shared by every kernel: the package docstring.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_backend.sampling.triton.verify import request_span


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


__all__ = [
    "argmax_kernel",
    "greedy_fused_kernel",
    "greedy_verify_kernel",
    "row_argmax",
]
