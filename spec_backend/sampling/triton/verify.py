# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""The accept/reject scans of the rejection sampler and its residual sampler: ``scan_verify_kernel``
(the token-level rule, plain or cumulative, with optional entropy thresholds), ``block_verify_kernel``
(Sun et al.'s block rule, with the residual-mass vocabulary pass fused), ``synthetic_verify_kernel``, and
``sample_residual_kernel`` with its pieces (``race_keys``, ``residual_races``: the exponential race over
max(b·p − q, 0), noise hashed in registers, which the split and fused kernels reuse); ``request_span``,
the batch layout every per-request kernel reads. The conventions shared by every kernel (persistent
grids, ``div_rn``, no FMA contraction): the package docstring.

Precision (constexpr ``F64``): with ``F64=True`` (CUDA) every per-token scalar — ratios ρ, thresholds τ,
uniforms, block weights b_i, the cumulative products — is float64, as in the torch reference, so the
scans are bit-exact. With ``F64=False`` (Ascend: ``SamplerTuning.device_uniforms=False``, no float64 on
the vector cores) the host side hands the kernels float32 copies of the uniforms / thresholds / scales
and the scans run in float32: decisions then differ from the reference only when a comparison is
within float32 rounding (relative 2^-24) of a tie.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spec_backend.sampling.triton.rng import row_key, vocab_uniform
from spec_backend.sampling.triton.softmax import row_probs


# --------------------------------------------------------------------------- the batch layout
@triton.jit
def request_span(cu_ptr, b):  # -> (first draft index, number of drafts) of request b, int64
    end = tl.load(cu_ptr + b).to(tl.int64)
    prev = tl.load(cu_ptr + b - 1, mask=b > 0, other=0).to(tl.int64)
    return prev, end - prev


@triton.jit
def _scalar(x, F64: tl.constexpr):
    if F64:
        return x.to(tl.float64)
    else:
        return x.to(tl.float32)


@triton.jit
def _div(x, y, F64: tl.constexpr):  # IEEE round-to-nearest division (float64 '/' is always IEEE)
    if F64:
        return x / y
    else:
        return tl.math.div_rn(x, y)


@triton.jit
def draft_p_q(
    t,  # draft index
    draft_ptr,
    dprobs_ptr,
    dp_stride,
    tprobs_ptr,
    tp_stride,
    trow_ptr,
    HAS_Q: tl.constexpr,
    F64: tl.constexpr,
):
    """``torch_ops.draft_p_q`` for one draft: (p(x), q(x)); q = 1 for a point mass, (0, 0) for a null
    draft (x = -1), which is never used as an index."""
    x = tl.load(draft_ptr + t).to(tl.int64)
    real = x >= 0
    x = tl.maximum(x, 0)
    row = tl.load(trow_ptr + t).to(tl.int64)
    p = _scalar(tl.where(real, tl.load(tprobs_ptr + row * tp_stride + x), 0.0), F64)
    if HAS_Q:
        q = _scalar(tl.where(real, tl.load(dprobs_ptr + tl.cast(t, tl.int64) * dp_stride + x), 0.0), F64)
    else:
        q = _scalar(tl.where(real, 1.0, 0.0), F64)
    return p, q


@triton.jit
def draft_ratio(
    t,  # draft index
    draft_ptr,
    dprobs_ptr,
    dp_stride,
    tprobs_ptr,
    tp_stride,
    trow_ptr,
    HAS_Q: tl.constexpr,
    F64: tl.constexpr,
):
    """``torch_ops.draft_ratios`` for one draft: ρ = p(x)/q(x) (0 where p(x) = 0; point mass: p(x));
    a null draft (x = -1) has ρ = 0."""
    p, q = draft_p_q(t, draft_ptr, dprobs_ptr, dp_stride, tprobs_ptr, tp_stride, trow_ptr, HAS_Q, F64)
    if HAS_Q:
        return tl.where(p > 0, _div(p, q, F64), 0.0)
    else:
        return p


@triton.jit
def scan_verify_kernel(
    draft_ptr,  # [T] int
    dprobs_ptr,  # [T, V] float (unused without HAS_Q)
    dp_stride,
    tprobs_ptr,  # [N, V] float32
    tp_stride,
    trow_ptr,  # [T] int
    u_ptr,  # [T] float64 (F64) / float32
    thr_ptr,  # [T] float64 / float32 (unused without HAS_THR)
    cu_ptr,  # [B] int
    out_ptr,  # [B] int64 accepted drafts
    B,
    HAS_Q: tl.constexpr,
    HAS_THR: tl.constexpr,
    CUMULATIVE: tl.constexpr,
    F64: tl.constexpr,
):
    """Token-level (``CUMULATIVE=False``) or vllm-ascend's cumulative block rule, as
    ``TorchSamplerOps.standard_verify`` / ``cumulative_verify`` define them: without thresholds the
    lossless leading run of u < ρ; with thresholds vllm-ascend's leading run of (q > 0 and p/q ≥ τ·u);
    cumulative: π_i = min(π_{i-1}·p/q, 1) (NaN propagates and never passes), the last i with q_i > 0 and
    π_i ≥ τ_i·Π_{j≤i} u_j. Grid: min(B, max_grid) programs, persistent over requests; each scans its K_b
    slots sequentially (the products associate left to right, like the reference). No vocabulary pass:
    2 gathered elements per draft."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for b in tl.range(pid, B, nprog):
        start, n = request_span(cu_ptr, b)
        count = tl.zeros([], tl.int64)
        alive = tl.full([], 1, tl.int1)
        pi = _scalar(tl.full([], 1.0, tl.float32), F64)
        cum_u = _scalar(tl.full([], 1.0, tl.float32), F64)
        for j in range(0, n):
            t = start + j
            u = _scalar(tl.load(u_ptr + t), F64)
            thr = _scalar(tl.full([], 1.0, tl.float32), F64)
            if HAS_THR:
                thr = _scalar(tl.load(thr_ptr + t), F64)
            if CUMULATIVE or HAS_THR:
                p, q = draft_p_q(
                    t, draft_ptr, dprobs_ptr, dp_stride, tprobs_ptr, tp_stride, trow_ptr, HAS_Q, F64
                )
                if CUMULATIVE:
                    pi = tl.minimum(_div(pi * p, q, F64), 1.0, propagate_nan=tl.PropagateNan.ALL)
                    cum_u = cum_u * u
                    count = tl.where((q > 0) & (pi >= thr * cum_u), j + 1, count)
                else:
                    ratio = _div(p, tl.where(q > 0, q, 1.0), F64)
                    alive = alive & (q > 0) & (ratio >= thr * u)
                    count += alive.to(tl.int64)
            else:
                rho = draft_ratio(
                    t, draft_ptr, dprobs_ptr, dp_stride, tprobs_ptr, tp_stride, trow_ptr, HAS_Q, F64
                )
                alive = alive & (u < rho)
                count += alive.to(tl.int64)
        tl.store(out_ptr + b, count)


@triton.jit
def residual_mass(
    weight,  # float32 b
    t,  # draft index
    draft_ptr,
    dprobs_ptr,
    dp_stride,
    tprobs_ptr,
    tp_stride,
    trow_ptr,
    V,
    HAS_Q: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Σ_v max(b·p(v) − q(v), 0) over one draft row, float32, in BLOCK_V blocks (one read of p and q);
    q = 0 for a null draft (x = -1)."""
    row = tl.load(trow_ptr + t).to(tl.int64)
    x = tl.load(draft_ptr + t).to(tl.int32)
    q_mask_v = tl.where(x >= 0, V, 0)  # q is read only for a real draft
    p_row = tprobs_ptr + row * tp_stride
    q_row = dprobs_ptr + tl.cast(t, tl.int64) * dp_stride
    acc = tl.zeros([BLOCK_V], tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        mask = offs < V
        w = weight * tl.load(p_row + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_Q:
            w = w - tl.load(q_row + offs, mask=offs < q_mask_v, other=0.0).to(tl.float32)
        else:
            w = w - tl.where(offs == x, 1.0, 0.0)
        acc += tl.maximum(w, 0.0)
    return tl.sum(acc, axis=0)


@triton.jit
def block_verify_kernel(
    draft_ptr, dprobs_ptr, dp_stride, tprobs_ptr, tp_stride, trow_ptr,  # [T], [T, V], [N, V] f32, [T]
    u_ptr,  # [T] float64 / float32: η of each slot
    thr_ptr,  # [T] float64 / float32
    cu_ptr,  # [B] int
    tau_ptr,  # [B] int64 out
    weight_ptr,  # [B] float64 / float32 out: b_τ
    B, V, HAS_Q: tl.constexpr, HAS_THR: tl.constexpr, F64: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Sun et al. 2024 Alg. 2 (``TorchSamplerOps.block_verify``). Grid: min(B, max_grid) programs,
    persistent over requests. Slot j (i = j + 1): b_i = min(1, b_{i-1}·ρ_i) (0 once 0);
    h_i = r_i / (r_i + 1 − b_i) for i < K with r_i = Σ_v max(b_i·p_{i+1} − q_{i+1}, 0) fused here as a
    BLOCK_V pass over draft row i's p and q; h_K = b_K; τ = last i with η_i < h_i. Traffic: rows
    1..K-1 of each request's p and q read once each (p only for point-mass drafts), i.e. at most the
    floor; the r_0 pass of the reference is skipped (it is never used)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for b in tl.range(pid, B, nprog):
        start, n = request_span(cu_ptr, b)
        weight = _scalar(tl.full([], 1.0, tl.float32), F64)  # b_{i-1}
        tau = tl.zeros([], tl.int64)
        b_tau = weight
        for j in range(0, n):
            t = start + j
            rho = draft_ratio(
                t, draft_ptr, dprobs_ptr, dp_stride, tprobs_ptr, tp_stride, trow_ptr, HAS_Q, F64
            )
            if HAS_THR:
                rho = tl.where(rho > 0, _div(rho, _scalar(tl.load(thr_ptr + t), F64), F64), 0.0)
            weight = tl.where(weight > 0, tl.minimum(weight * rho, 1.0), 0.0)  # b_i
            h = weight
            if j + 1 < n:
                r = residual_mass(
                    weight.to(tl.float32),
                    t + 1,
                    draft_ptr,
                    dprobs_ptr,
                    dp_stride,
                    tprobs_ptr,
                    tp_stride,
                    trow_ptr,
                    V,
                    HAS_Q,
                    BLOCK_V,
                )
                r = _scalar(r, F64)
                denom = r + (1.0 - weight)
                h = tl.where(denom > 0, _div(r, tl.where(denom > 0, denom, 1.0), F64), 1.0)
            eta = _scalar(tl.load(u_ptr + t), F64)
            hit = eta < h
            tau = tl.where(hit, j + 1, tau)
            b_tau = tl.where(hit, weight, b_tau)
        tl.store(tau_ptr + b, tau)
        tl.store(weight_ptr + b, b_tau)


@triton.jit
def synthetic_verify_kernel(
    u_ptr,  # [B] float64 / float32
    rates_ptr,  # [R] float64 / float32
    cu_ptr,  # [B] int
    out_ptr,  # [B] int64
    B,
):
    """#{i < K_b : u_b < rates[i]}. Grid: min(B, max_grid), persistent over requests; K_b loads each."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for b in tl.range(pid, B, nprog):
        _, n = request_span(cu_ptr, b)
        u = tl.load(u_ptr + b)
        count = tl.zeros([], tl.int64)
        for i in range(0, n):
            count += (u < tl.load(rates_ptr + i)).to(tl.int64)
        tl.store(out_ptr + b, count)


@triton.jit
def race_step(keys, v0, best, idx):  # one block of a first-index argmax race: -> (best key, its index)
    mk, ik = tl.max(keys, axis=0, return_indices=True, return_indices_tie_break_left=True)
    return tl.maximum(mk, best), tl.where(mk > best, v0 + ik, idx)


@triton.jit
def race_keys(w, p, e, unit_scale, FROM_LOGITS: tl.constexpr, HAS_Q: tl.constexpr):  # -> (w/E, p/E) [BLOCK]
    """The race keys, IEEE-divided. A row made from logits has p <= 1 (its sum s >= exp(0)), so with
    b = 1 (``unit_scale``) and a point-mass draft max(b·p − q, 0) is p, or 0 at the draft: w/E is then
    p/E or 0 bit for bit, and one division per element does (measured: the race 4 % faster on an H100)."""
    kp = tl.math.div_rn(p, e)
    if FROM_LOGITS and not HAS_Q:
        if unit_scale:  # noqa: SIM108 -- a runtime branch, so that only one side divides
            kw = tl.where(w == p, kp, 0.0)
        else:
            kw = tl.math.div_rn(w, e)
    else:
        kw = tl.math.div_rn(w, e)
    return kw, kp


@triton.jit
def residual_races(
    tprobs_ptr, tp_stride, trow_ptr, dprobs_ptr, dp_stride, draft_ptr, drow_ptr, scale_ptr, seed_ptr,
    pos_ptr,
    r,  # output row
    start,  # first vocabulary id of the span
    end,  # one past the last
    V,
    stats_ptr,  # [3, R] float32 (FROM_LOGITS): temperature (0: skip the row), row max, row sum
    HAS_DRAFTS: tl.constexpr, HAS_Q: tl.constexpr, STREAM: tl.constexpr, BLOCK_V: tl.constexpr,
    FROM_LOGITS: tl.constexpr,  # tprobs_ptr holds logits: p = row_probs(...), never stored
    R,  # rows of stats (FROM_LOGITS)
):  # fmt: skip
    """Output row r's two exponential races over vocabulary ids [start, end): returns (any w > 0, best
    w/E, its first index, best p/E, its first index). See ``sample_residual_kernel``."""
    if FROM_LOGITS:
        t, m, s = tl.load(stats_ptr + r), tl.load(stats_ptr + R + r), tl.load(stats_ptr + 2 * R + r)
        end = tl.where(t > 0, end, start)
    row = tl.load(trow_ptr + r).to(tl.int64)
    d = tl.load(drow_ptr + r).to(tl.int64)
    has = d >= 0
    d = tl.maximum(d, 0)
    scale = tl.load(scale_ptr + r).to(tl.float32)
    key = row_key(tl.load(seed_ptr + r), tl.load(pos_ptr + r), STREAM)
    x = tl.full([], -1, tl.int32)
    if HAS_DRAFTS:
        x = tl.where(has, tl.load(draft_ptr + d).to(tl.int32), -1)
        has = has & (x >= 0)  # a null draft (-1) has q = 0
    p_row = tprobs_ptr + row * tp_stride
    q_row = dprobs_ptr + d * dp_stride
    unit_scale = scale == 1.0  # see race_keys
    w_any = tl.full([], 0, tl.int1)
    best_w = tl.full([], -1.0, tl.float32)
    idx_w = tl.zeros([], tl.int32)
    best_p = tl.full([], -1.0, tl.float32)
    idx_p = tl.zeros([], tl.int32)
    for v0 in range(start, end, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        mask = offs < V
        if FROM_LOGITS:
            p = row_probs(p_row, offs, mask, t, m, s)
        else:
            p = tl.load(p_row + offs, mask=mask, other=0.0).to(tl.float32)
        w = scale * p
        if HAS_DRAFTS:
            if HAS_Q:
                q = tl.load(q_row + offs, mask=mask & (offs < V * has), other=0.0).to(tl.float32)
            else:
                q = tl.where(offs == x, 1.0, 0.0)
            w = tl.maximum(w - q, 0.0)
        w_any = w_any | (tl.max(tl.where(mask & (w > 0), 1, 0), axis=0) > 0)
        e = -tl.log(vocab_uniform(key, offs))
        kw, kp = race_keys(w, p, e, unit_scale, FROM_LOGITS, HAS_Q)
        best_w, idx_w = race_step(tl.where(mask, kw, -1.0), v0, best_w, idx_w)
        best_p, idx_p = race_step(tl.where(mask, kp, -1.0), v0, best_p, idx_p)
    return w_any, best_w, idx_w, best_p, idx_p


@triton.jit
def sample_residual_kernel(
    tprobs_ptr,  # [N, V] float32
    tp_stride,
    trow_ptr,  # [R] int
    dprobs_ptr,  # [T, V] float (unused without HAS_Q)
    dp_stride,
    draft_ptr,  # [T] int (unused without HAS_DRAFTS)
    drow_ptr,  # [R] int, -1: no draft
    scale_ptr,  # [R] float32 weight b (the reference applies it in float32)
    seed_ptr,  # [R] int64
    pos_ptr,  # [R] int64
    out_ptr,  # [R] int64
    R,
    V,
    HAS_DRAFTS: tl.constexpr,
    HAS_Q: tl.constexpr,
    STREAM: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Exponential race argmax_v w_v / E_v over w = max(b·p − q, 0) (p when w ≡ 0), E_v = −log(u_v),
    with u_v hashed in registers from (seed, position, STREAM, v): no noise tensor exists. Grid:
    min(R, max_grid), persistent over output rows; ONE pass over the row: the races of w and of p run
    side by side and the final ``any(w > 0)`` picks one, so the fallback costs no second read.
    Traffic: p row + q row (p only for point masses / bonus rows) per output. With few rows, the split
    kernels (``triton.split``) share each row among several programs."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for r in tl.range(pid, R, nprog):
        w_any, _, idx_w, _, idx_p = residual_races(
            tprobs_ptr, tp_stride, trow_ptr, dprobs_ptr, dp_stride, draft_ptr, drow_ptr, scale_ptr,
            seed_ptr, pos_ptr, r, 0, V, V, scale_ptr, HAS_DRAFTS, HAS_Q, STREAM, BLOCK_V, False, R,
        )  # fmt: skip
        tl.store(out_ptr + r, tl.where(w_any, idx_w, idx_p).to(tl.int64))


__all__ = [
    "block_verify_kernel",
    "draft_p_q",
    "draft_ratio",
    "race_keys",
    "race_step",
    "request_span",
    "residual_mass",
    "residual_races",
    "sample_residual_kernel",
    "scan_verify_kernel",
    "synthetic_verify_kernel",
]
