# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""Shared triton kernels of the rejection sampler, part 4: the whole verification of a batch of
*point-mass* drafts (no draft probabilities, no top-k / top-p) in one read of the logits.

Why: with point-mass drafts every decision needs only p(x) of each draft, and the recovered / bonus token
is an exponential race over p with the draft excluded. Both come from per-row statistics that one pass
over the logits can gather, so the [N, V] probabilities need not exist: the composed path (softmax,
verify scan, residual race) reads the logits twice, writes and re-reads the probabilities, and launches
~30 small torch kernels around them (measured on an H200 at B=64, K=4: 6-11% of the bandwidth floor).

Glossary: an *entry* is one logits row in verification order: entries 0..T-1 are the drafts (row
``target_rows[t]``, request ``request_index[t]``, slot ``slot_index[t]``), entries T..T+B-1 the bonus rows
(request b, slot K_b). A *chunk* is one of ``splits`` contiguous vocabulary spans of a row (as in
``triton_kernels_split``); a *work item* is (entry, chunk).

Pass 1, ``point_mass_rows_kernel`` (one program per work item, persistent): z = logits / T (greedy rows:
T = 1, so z is the raw logits), the online (max, sum-exp) of z exactly as ``softmax_stats`` computes it,
the first index of the max (the argmax of greedy rows) and the race: argmax over v != x of
z_v − log(E_v), E_v = −log(u_v), u_v the row's hashed noise (``STREAM_SAMPLE`` at the emitted token's
position, i.e. the request's position + the entry's slot). That is the race of the reference,
argmax_v p_v / E_v, taken in log space where it needs neither the row's max nor its sum.

Pass 2, ``point_mass_finish_kernel`` (one program per request): combines each entry's chunks in chunk
order (the statistics exactly as ``softmax_normalise_kernel`` does, so p(x) = exp(z_x − M) / S is the
composed path's float32 value), runs the greedy chain, the token-level chain (accept while u < p(x)) or
Sun et al.'s block scan (``BLOCK``), and writes the output row: accepted drafts, the recovered or bonus
token (the race winner of the entry where the chain stopped), placeholders.

Exactness against the composed path: the accept decisions and the greedy tokens are bit-identical. The
race is compared in log space (z − log E rather than p / E), and the block scan takes the residual mass
of a point-mass row as b·(1 − p(x)) (b for a null draft) instead of a blocked float32 sum, so a token or
a block decision can differ only at a float32 near-tie (relative gap below ~2^-22). A row whose draft
has p(x) = 1 in float32 samples its residual from the other entries' (underflowed) weights where the
reference falls back to p; that row is never rejected by the token-level rule (u < 1).
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_backend.sampling.triton_kernels import (
    TWO_POW_M53,
    random_u32,
    request_span,
    row_key,
    row_temperature,
    vocab_uniform,
)


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
def point_mass_rows_kernel(
    logits_ptr,  # [N, V] float
    stride,
    draft_ptr,  # [T] int (a stand-in when T = 0)
    trow_ptr,  # [T] int
    brow_ptr,  # [B] int
    req_ptr,  # [T] int64
    slot_ptr,  # [T] int64
    cu_ptr,  # [B] int
    temp_ptr,  # [B] float (<= 0: greedy, T = 1)
    seed_ptr,  # [B] int64
    pos_ptr,  # [B] int64
    max_ptr,  # [E * splits] float32 out: chunk max of z
    sum_ptr,  # [E * splits] float32 out: chunk sum of exp(z - chunk max)
    key_ptr,  # [E * splits] float32 out: chunk's best race key (x excluded)
    amax_ptr,  # [E * splits] int32 out: first index of the chunk max
    win_ptr,  # [E * splits] int32 out: the race key's index
    T,
    E,
    V,
    splits,
    chunk,
    SAMPLED: tl.constexpr,  # any request samples (False: argmax only)
    STREAM: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Pass 1 (see the module docstring). Traffic: every logits row read once, 20 bytes per item."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for item in tl.range(pid, E * splits, nprog):
        e = item // splits
        start = (item % splits) * chunk
        row, req, slot, x = entry_of(e, T, draft_ptr, trow_ptr, brow_ptr, req_ptr, slot_ptr, cu_ptr, V)
        src = logits_ptr + row * stride
        t = row_temperature(temp_ptr, req)
        key = row_key(tl.load(seed_ptr + req), tl.load(pos_ptr + req) + slot, STREAM)
        m = tl.full([], float("-inf"), tl.float32)
        s = tl.zeros([], tl.float32)
        amax = tl.zeros([], tl.int32)
        best = tl.full([], float("-inf"), tl.float32)
        win = tl.zeros([], tl.int32)
        for v0 in range(start, tl.minimum(start + chunk, V), BLOCK_V):
            offs = v0 + tl.arange(0, BLOCK_V)
            z = tl.math.div_rn(tl.load(src + offs, mask=offs < V, other=float("-inf")).to(tl.float32), t)
            bm, bi = tl.max(z, axis=0, return_indices=True, return_indices_tie_break_left=True)
            amax = tl.where(bm > m, v0 + bi, amax)
            new_m = tl.maximum(m, bm)
            if SAMPLED:
                ez = tl.where(z == float("-inf"), 0.0, tl.exp(z - new_m))
                s = s * tl.where(m == new_m, 1.0, tl.exp(m - new_m)) + tl.sum(ez, axis=0)
                g = z - tl.log(-tl.log(vocab_uniform(key, offs)))
                g = tl.where(offs == x, float("-inf"), g)
                gm, gi = tl.max(g, axis=0, return_indices=True, return_indices_tie_break_left=True)
                win = tl.where(gm > best, v0 + gi, win)
                best = tl.maximum(best, gm)
            m = new_m
        tl.store(max_ptr + item, m)
        tl.store(sum_ptr + item, s)
        tl.store(key_ptr + item, best)
        tl.store(amax_ptr + item, amax)
        tl.store(win_ptr + item, win)


@triton.jit
def entry_result(
    e, T, logits_ptr, stride, draft_ptr, trow_ptr, brow_ptr, req_ptr, slot_ptr, cu_ptr, temp_ptr,
    max_ptr, sum_ptr, key_ptr, amax_ptr, win_ptr, V, splits, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Entry e's chunks combined: (draft id or -1, p(x) float32 (0 for -1), race token, argmax)."""
    row, req, _, x = entry_of(e, T, draft_ptr, trow_ptr, brow_ptr, req_ptr, slot_ptr, cu_ptr, V)
    parts = tl.arange(0, BLOCK_S)
    ok = parts < splits
    items = e * splits + parts
    pm = tl.load(max_ptr + items, mask=ok, other=float("-inf"))
    ps = tl.load(sum_ptr + items, mask=ok, other=0.0)
    pk = tl.load(key_ptr + items, mask=ok, other=float("-inf"))
    m = tl.max(pm, axis=0)
    s = tl.sum(tl.where(pm == float("-inf"), 0.0, ps * tl.exp(pm - m)), axis=0)  # softmax_normalise's
    _, cm = tl.max(pm, axis=0, return_indices=True, return_indices_tie_break_left=True)
    best, ck = tl.max(pk, axis=0, return_indices=True, return_indices_tie_break_left=True)
    amax = tl.load(amax_ptr + e * splits + cm).to(tl.int64)
    win = tl.load(win_ptr + e * splits + ck).to(tl.int64)
    t = row_temperature(temp_ptr, req)
    zx = tl.math.div_rn(tl.load(logits_ptr + row * stride + tl.maximum(x, 0)).to(tl.float32), t)
    ex = tl.where(zx == float("-inf"), 0.0, tl.exp(zx - m))
    px = tl.where(x >= 0, tl.math.div_rn(ex, s), 0.0)
    token = tl.where(best > float("-inf"), win, tl.where(x >= 0, x.to(tl.int64), amax))
    return x, px, token, amax


@triton.jit
def accept_uniform(seed, position, counter, STREAM: tl.constexpr):  # -> float64, ``rng.uniform_f64``
    key = row_key(seed, position, STREAM)
    hi = (random_u32(key, 2 * counter) >> 5).to(tl.int64)
    lo = (random_u32(key, 2 * counter + 1) >> 6).to(tl.int64)
    return ((hi << 26) | lo).to(tl.float64) * TWO_POW_M53


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
def point_mass_finish_kernel(
    logits_ptr, stride, draft_ptr, trow_ptr, brow_ptr, req_ptr, slot_ptr, cu_ptr, temp_ptr, seed_ptr,
    pos_ptr, max_ptr, sum_ptr, key_ptr, amax_ptr, win_ptr,
    out_ptr,  # [B, S + 1] int32
    T, B, V, S, splits,
    SAMPLED: tl.constexpr, BLOCK: tl.constexpr, ACCEPT: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Pass 2 (see the module docstring). Grid: min(B, max_grid), persistent over requests."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for b in tl.range(pid, B, nprog):
        start, n = request_span(cu_ptr, b)
        greedy = tl.load(temp_ptr + b) <= 0
        seed = tl.load(seed_ptr + b)
        pos = tl.load(pos_ptr + b)
        x, px, cand, amax = entry_result(
            tl.where(n > 0, start, T + b), T, logits_ptr, stride, draft_ptr, trow_ptr, brow_ptr, req_ptr,
            slot_ptr, cu_ptr, temp_ptr, max_ptr, sum_ptr, key_ptr, amax_ptr, win_ptr, V, splits, BLOCK_S,
        )  # fmt: skip
        g_alive = tl.full([], 1, tl.int1)
        g_count = tl.zeros([], tl.int64)
        g_token = tl.zeros([], tl.int64)
        r_alive = tl.full([], 1, tl.int1)
        r_count = tl.zeros([], tl.int64)
        r_token = cand  # block: tau = 0 samples at slot 0
        weight = tl.full([], 1.0, tl.float64)
        for j in range(0, n):
            nx, npx, ncand, namax = entry_result(
                tl.where(j + 1 < n, start + j + 1, T + b), T, logits_ptr, stride, draft_ptr, trow_ptr,
                brow_ptr, req_ptr, slot_ptr, cu_ptr, temp_ptr, max_ptr, sum_ptr, key_ptr, amax_ptr, win_ptr,
                V, splits, BLOCK_S,
            )  # fmt: skip
            ok = g_alive & (x.to(tl.int64) == amax)
            g_token = tl.where(g_alive & ~ok, amax, g_token)
            g_count += ok.to(tl.int64)
            g_alive = ok
            if SAMPLED:
                u = accept_uniform(seed, pos, tl.zeros([], tl.int64) + j, ACCEPT)  # counter = slot
                if BLOCK:
                    weight, hit = block_hit(weight, px.to(tl.float64), npx, j + 1 == n, u)
                    r_count = tl.where(hit, j + 1, r_count)
                    r_token = tl.where(hit, ncand, r_token)
                else:
                    ok = r_alive & (u < px.to(tl.float64))
                    r_token = tl.where(r_alive & ~ok, cand, r_token)
                    r_count += ok.to(tl.int64)
                    r_alive = ok
            x, px, cand, amax = nx, npx, ncand, namax
        g_token = tl.where(g_alive, amax, g_token)  # the bonus entry's
        if not BLOCK:
            r_token = tl.where(r_alive, cand, r_token)
        count = tl.where(greedy, g_count, r_count)
        token = tl.where(greedy, g_token, r_token)
        for j in range(0, S + 1):
            d = tl.load(draft_ptr + start + j, mask=j < count, other=-1).to(tl.int64)
            value = tl.where(j < count, d, tl.where(j == count, token, -1))
            tl.store(out_ptr + tl.cast(b, tl.int64) * (S + 1) + j, value.to(tl.int32))


__all__ = ["accept_uniform", "block_hit", "entry_of", "entry_result", "point_mass_finish_kernel",
           "point_mass_rows_kernel"]  # fmt: skip
