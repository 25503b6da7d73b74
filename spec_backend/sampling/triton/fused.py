# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""The verification of a batch without materialising the target probabilities (requests without
top-k / top-p): the token-level rule with or without draft probabilities, Sun et al.'s lossless block
rule for *point-mass* drafts (no draft probabilities: q is 1 at the draft).

Why: then every decision needs only p(x) (and q(x)) of each draft, so the composed path's
[N, V] probabilities (written once, read again by the residual race) and its ~30 small torch kernels are
not needed (measured on an H200 at B=64, K=4: 6-11 % of the bandwidth floor composed).

Glossary: an *entry* is one logits row in verification order: entries 0..T-1 are the drafts (row
``target_rows[t]``, request ``request_index[t]``, slot ``slot_index[t]``), entries T..T+B-1 the bonus rows
(request b, slot K_b). A *chunk* is one of ``splits`` contiguous vocabulary spans of a row (as in
``triton.split``); a *work item* is (entry, chunk). The *final entry* of a request is the one
whose row the emitted (recovered or bonus) token is sampled from.

Four launches:

1. ``fused_stats_kernel`` (per work item): z = logits / T (greedy rows: T = 1, so z is the raw
   logits), the online (max, sum-exp) of z exactly as ``softmax_stats`` computes it, and the first index
   of the max (the greedy token). One read of every row: the floor.
2. ``fused_decide_kernel`` (per request): combines each entry's chunks in chunk order (as
   ``softmax_normalise_kernel`` does, so p(x) = exp(z_x − M) / S is the composed path's float32 value),
   runs the greedy chain, the token-level chain (accept while u < ρ = p(x)/q(x), ``draft_ratio``'s ρ) or
   Sun et al.'s block scan
   (``BLOCK``), and writes the final entry's row, draft, weight b, position and statistics.
3. ``residual_partials_kernel`` with ``FROM_LOGITS`` (per request and chunk): the composed path's
   residual race over the final entry's row (max(b·p − q, 0); q = the draft's row, or 1 at the draft for a
   point mass), with p made on the fly from the logits and the statistics:
   the same keys as the composed path, so the same token. Greedy requests skip it. Reads B rows again.
4. ``fused_output_kernel`` (per request): combines the race chunks and writes the output row.

Exactness against the composed path: the same tokens, except that the block scan takes the residual
mass of a point-mass row as b·(1 − p(x)) (b for a null draft) rather than a blocked float32 sum of
max(b·p − q, 0), so a block decision can differ at a float32 near-tie (relative gap ~1e-6).
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_backend.sampling.triton.rng import uniform_f64
from spec_backend.sampling.triton.softmax import online_sum, row_probs, row_temperature, scaled_logits
from spec_backend.sampling.triton.split import combine_stats, combined_race
from spec_backend.sampling.triton.verify import request_span


@triton.jit
def entry_of(e, T, draft_ptr, trow_ptr, brow_ptr, req_ptr, slot_ptr, cu_ptr, V):
    """(logits row, request, slot, draft id or -1) of entry e; ids outside [0, V) are null (-1)."""
    is_draft = e < T
    t = tl.minimum(e, T - 1)
    b = tl.maximum(e - T, 0)
    _, n = request_span(cu_ptr, b)
    row = tl.where(
        is_draft,
        tl.load(trow_ptr + t, mask=is_draft, other=0).to(tl.int64),
        tl.load(brow_ptr + b, mask=~is_draft, other=0).to(tl.int64),
    )
    req = tl.where(is_draft, tl.load(req_ptr + t, mask=is_draft, other=0).to(tl.int64), b.to(tl.int64))
    slot = tl.where(is_draft, tl.load(slot_ptr + t, mask=is_draft, other=0).to(tl.int64), n)
    x = tl.load(draft_ptr + t, mask=is_draft, other=-1).to(tl.int32)
    x = tl.where((x >= 0) & (x < V), x, -1)
    return row, req, slot, x


@triton.jit
def fused_stats_kernel(
    logits_ptr,  # [N, V] float
    stride,
    draft_ptr,  # [T] int (a stand-in when T = 0)
    trow_ptr,  # [T] int
    brow_ptr,  # [B] int
    req_ptr,  # [T] int64
    slot_ptr,  # [T] int64
    cu_ptr,  # [B] int
    temp_ptr,  # [B] float (<= 0: greedy, T = 1)
    max_ptr,  # [E * splits] float32 out: chunk max of z
    sum_ptr,  # [E * splits] float32 out: chunk sum of exp(z - chunk max)
    amax_ptr,  # [E * splits] int32 out: first index of the chunk max
    T,
    E,
    V,
    splits,
    chunk,
    SAMPLED: tl.constexpr,  # any request samples (False: the argmax only)
    BLOCK_V: tl.constexpr,
):
    """Launch 1 (see the module docstring). Traffic: every logits row read once, 12 bytes per item."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for item in tl.range(pid, E * splits, nprog):
        e = item // splits
        start = (item % splits) * chunk
        row, req, _, _ = entry_of(e, T, draft_ptr, trow_ptr, brow_ptr, req_ptr, slot_ptr, cu_ptr, V)
        src = logits_ptr + row * stride
        t = row_temperature(temp_ptr, req)
        m = tl.full([], float("-inf"), tl.float32)
        s = tl.zeros([], tl.float32)
        amax = tl.zeros([], tl.int32)
        for v0 in range(start, tl.minimum(start + chunk, V), BLOCK_V):
            offs = v0 + tl.arange(0, BLOCK_V)
            z = scaled_logits(src, offs, offs < V, t)
            bm, bi = tl.max(z, axis=0, return_indices=True, return_indices_tie_break_left=True)
            amax = tl.where(bm > m, v0 + bi, amax)
            new_m = tl.maximum(m, bm)
            if SAMPLED:
                s = online_sum(s, m, new_m, z)  # softmax_stats' update
            m = new_m
        tl.store(max_ptr + item, m)
        tl.store(sum_ptr + item, s)
        tl.store(amax_ptr + item, amax)


@triton.jit
def entry_result(
    e, T, logits_ptr, stride, draft_ptr, trow_ptr, brow_ptr, req_ptr, slot_ptr, cu_ptr, temp_ptr,
    max_ptr, sum_ptr, amax_ptr, dprobs_ptr, dp_stride, V, splits, BLOCK_S: tl.constexpr, HAS_Q: tl.constexpr,
):  # fmt: skip
    """Entry e's chunks combined: (logits row, draft id or -1, p(x) float32 (0 for -1), the float64 ratio
    ρ = p(x)/q(x) of ``draft_ratio`` (p(x) for a point mass, 0 where p(x) = 0), argmax, M, S)."""
    row, req, _, x = entry_of(e, T, draft_ptr, trow_ptr, brow_ptr, req_ptr, slot_ptr, cu_ptr, V)
    parts = tl.arange(0, BLOCK_S)
    ok = parts < splits
    pm = tl.load(max_ptr + e * splits + parts, mask=ok, other=float("-inf"))
    ps = tl.load(sum_ptr + e * splits + parts, mask=ok, other=0.0)
    m, s = combine_stats(pm, ps)  # softmax_normalise_kernel's
    _, cm = tl.max(pm, axis=0, return_indices=True, return_indices_tie_break_left=True)
    amax = tl.load(amax_ptr + e * splits + cm).to(tl.int64)
    t = row_temperature(temp_ptr, req)
    px = tl.where(x >= 0, row_probs(logits_ptr + row * stride, tl.maximum(x, 0), True, t, m, s), 0.0)
    rho = px.to(tl.float64)
    if HAS_Q:
        t_q = tl.minimum(e, T - 1).to(tl.int64)
        qx = tl.load(dprobs_ptr + t_q * dp_stride + tl.maximum(x, 0), mask=(x >= 0) & (e < T), other=0.0)
        rho = tl.where(rho > 0, rho / qx.to(tl.float64), 0.0)
    return row, x, px, rho, amax, m, s


@triton.jit
def block_hit(weight, rho, p_next, last, u):
    """One slot of Sun et al.'s scan for point masses: (b_i, η < h_i). b_i = min(1, b_{i-1}·ρ) (0 once 0);
    h_i = r / (r + 1 − b_i) with r = b_i·(1 − p_{i+1}(x_{i+1})) (a null next draft has p = 0: r = b_i),
    h_K = b_K."""
    weight = tl.where(weight > 0, tl.minimum(weight * rho, 1.0), 0.0)
    r = (weight.to(tl.float32) * (1.0 - p_next)).to(tl.float64)
    denom = r + (1.0 - weight)
    h = tl.where(denom > 0, r / tl.where(denom > 0, denom, 1.0), 1.0)
    return weight, u < tl.where(last, weight, h)


@triton.jit
def sampled_step(weight, f_weight, alive, count, rho, p_next, j, n, u, BLOCK: tl.constexpr):
    """Slot j of a sampled request: the block scan (``block_hit``) or the token-level chain (accept while
    u < ρ). Returns (b_j, b of the final entry, chain alive, accepted count, whether the final entry
    moves to slot j + 1)."""
    if BLOCK:
        weight, hit = block_hit(weight, rho, p_next, j + 1 == n, u)
        count = tl.where(hit, j + 1, count)
        f_weight = tl.where(hit, weight, f_weight)
    else:
        hit = alive & (u < rho)
        count += hit.to(tl.int64)
        alive = hit
    return weight, f_weight, alive, count, hit


@triton.jit
def fused_decide_kernel(
    logits_ptr, stride, draft_ptr, trow_ptr, brow_ptr, req_ptr, slot_ptr, cu_ptr, temp_ptr, seed_ptr,
    pos_ptr, max_ptr, sum_ptr, amax_ptr,
    dprobs_ptr, dp_stride,  # [T, V] float draft probabilities (HAS_Q; the token-level rule only)
    count_ptr,  # [B] int64 out: accepted drafts
    frow_ptr,  # [B] int64 out: the final entry's logits row
    fdraft_ptr,  # [B] int64 out: the final entry's draft index (-1: bonus)
    scale_ptr,  # [B] float32 out: the residual weight b (1 for the token-level rule)
    fpos_ptr,  # [B] int64 out: the emitted token's position
    stats_ptr,  # [3, B] float32 out: temperature (0 for greedy: no race), M, S of the final entry
    token_ptr,  # [B] int64 out: the greedy token (argmax of the final entry)
    T, B, V, splits, HAS_Q: tl.constexpr,
    SAMPLED: tl.constexpr, BLOCK: tl.constexpr, ACCEPT: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Launch 2 (see the module docstring). Grid: min(B, max_grid), persistent over requests."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for b in tl.range(pid, B, nprog):
        start, n = request_span(cu_ptr, b)
        greedy = tl.load(temp_ptr + b) <= 0
        seed, pos = tl.load(seed_ptr + b), tl.load(pos_ptr + b)
        row, x, _, rho, amax, m, s = entry_result(
            tl.where(n > 0, start, T + b), T, logits_ptr, stride, draft_ptr, trow_ptr, brow_ptr, req_ptr,
            slot_ptr, cu_ptr, temp_ptr, max_ptr, sum_ptr, amax_ptr, dprobs_ptr, dp_stride, V, splits,
            BLOCK_S, HAS_Q,
        )  # fmt: skip
        g_alive = tl.full([], 1, tl.int1)
        g_count = tl.zeros([], tl.int64)
        g_amax = amax
        r_alive = tl.full([], 1, tl.int1)
        r_count = tl.zeros([], tl.int64)
        f_row, f_m, f_s = row, m, s  # the sampled requests' final entry (block: tau = 0 -> slot 0)
        weight = tl.full([], 1.0, tl.float64)
        f_weight = weight
        for j in range(0, n):
            n_row, nx, npx, nrho, namax, nm, ns = entry_result(
                tl.where(j + 1 < n, start + j + 1, T + b), T, logits_ptr, stride, draft_ptr, trow_ptr,
                brow_ptr, req_ptr, slot_ptr, cu_ptr, temp_ptr, max_ptr, sum_ptr, amax_ptr, dprobs_ptr,
                dp_stride, V, splits, BLOCK_S, HAS_Q,
            )  # fmt: skip
            ok = g_alive & (x.to(tl.int64) == amax)  # the greedy chain
            g_count, g_amax, g_alive = g_count + ok.to(tl.int64), tl.where(ok, namax, g_amax), ok
            if SAMPLED:
                u = uniform_f64(seed, pos, tl.zeros([], tl.int64) + j, ACCEPT)  # counter = slot
                weight, f_weight, r_alive, r_count, hit = sampled_step(
                    weight, f_weight, r_alive, r_count, rho, npx, j, n, u, BLOCK
                )
                f_row, f_m, f_s = tl.where(hit, n_row, f_row), tl.where(hit, nm, f_m), tl.where(hit, ns, f_s)
            x, rho, amax = nx, nrho, namax
        count = tl.where(greedy, g_count, r_count)
        tl.store(count_ptr + b, count)
        tl.store(token_ptr + b, g_amax)
        tl.store(frow_ptr + b, f_row)  # greedy requests skip the race
        tl.store(fdraft_ptr + b, tl.where(count < n, start + count, -1))
        tl.store(scale_ptr + b, f_weight.to(tl.float32))
        tl.store(fpos_ptr + b, pos + count)
        tl.store(stats_ptr + b, tl.where(greedy, 0.0, row_temperature(temp_ptr, b)))
        tl.store(stats_ptr + B + b, f_m)
        tl.store(stats_ptr + 2 * B + b, f_s)


@triton.jit
def fused_output_kernel(
    part_key_ptr,  # [B * splits, 2] float32: the race chunks (residual_partials_kernel)
    part_idx_ptr,  # [B * splits, 2] int32
    part_any_ptr,  # [B * splits] int32
    count_ptr,  # [B] int64
    token_ptr,  # [B] int64 greedy tokens
    temp_ptr,  # [B] float
    draft_ptr,  # [T] int
    cu_ptr,  # [B] int
    out_ptr,  # [B, S + 1] int32
    B,
    S,
    splits,
    BLOCK_S: tl.constexpr,
):
    """Launch 4: row b = accepted drafts, the emitted token, placeholders (-1)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for b in tl.range(pid, B, nprog):
        start, _ = request_span(cu_ptr, b)
        count = tl.load(count_ptr + b)
        token = tl.load(token_ptr + b)
        if tl.load(temp_ptr + b) > 0:
            token = combined_race(part_key_ptr, part_idx_ptr, part_any_ptr, b, splits, BLOCK_S)
        for j in range(0, S + 1):
            d = tl.load(draft_ptr + start + j, mask=j < count, other=-1).to(tl.int64)
            value = tl.where(j < count, d, tl.where(j == count, token, -1))
            tl.store(out_ptr + tl.cast(b, tl.int64) * (S + 1) + j, value.to(tl.int32))


__all__ = [
    "block_hit",
    "entry_of",
    "entry_result",
    "fused_decide_kernel",
    "fused_output_kernel",
    "fused_stats_kernel",
    "sampled_step",
]
