"""``TorchSamplerOps``: the readable pure-torch reference of every sampler kernel (the specification).

Glossary
--------
* **draft tokens** x_1..x_K: the proposer's guesses for the next K positions of a request.
* **p_i / q_i**: target / draft distribution at draft position i (target row i, draft row i); p_{K+1}
  is the target distribution after the last draft (the *bonus row*).
* **point-mass draft**: when no ``draft_probs`` are given (n-gram, suffix, argmax drafters) the draft
  distribution is q_i = onehot(x_i), so ρ_i = p_i(x_i).
* **ratio** ρ_i = p_i(x_i) / q_i(x_i); q_i(x_i) = 0 gives ρ = +inf when p_i(x_i) > 0 and ρ = 0 when
  p_i(x_i) = 0 (a token the target cannot emit is always rejected).
* **accepted tokens**: the drafts kept, always a prefix x_1..x_n of the draft block.
* **recovered token**: the token emitted at the first position not accepted (n < K), sampled from the
  **residual** norm(max(b·p_{n+1} − q_{n+1}, 0)) (b = 1 for token-level verification).
* **bonus token**: emitted when all K drafts are accepted, sampled from p_{K+1}.
* **zero residual**: max(p − q, 0) has zero mass only when p == q. Token-level rejection then has
  probability Σ q·(1 − min(1, p/q)) = 0, and block verification never stops at such a position (h = 0
  there, and η < h is strict), so in exact arithmetic the branch is unreachable; when floating-point
  rounding reaches it, p and q are equal up to rounding and sampling p is the faithful choice.

Layout helpers turn [T] per-draft values into padded [B, max_spec_len] matrices (mask ``valid``) so
every rule is a handful of cumulative products / masks, with no Python loop over requests. Block
verification's weight recursion loops over the draft slots (at most 128), vectorised over requests.
"""

from __future__ import annotations

import torch

from spec_backend.sampling import probs as _probs
from spec_backend.sampling import rng
from spec_backend.sampling.gbv_ops import TorchGbvOps
from spec_backend.sampling.tree_ops import TorchTreeOps


def request_layout(
    cu_num_draft_tokens: torch.Tensor,  # [B]
    max_spec_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # index [B, S], valid [B, S], num [B]
    """Padded view of the drafts: ``index[b, j]`` = flat draft index of slot j (clamped when invalid)."""
    cu = cu_num_draft_tokens.to(torch.int64)  # [B]
    num = cu - torch.cat([cu.new_zeros(1), cu[:-1]])  # [B]
    slots = torch.arange(max_spec_len, device=cu.device, dtype=torch.int64)  # [S]
    index = (cu - num)[:, None] + slots[None, :]  # [B, S]
    valid = slots[None, :] < num[:, None]  # [B, S]
    last = torch.clamp(cu[-1:] - 1, min=0) if cu.numel() else cu.new_zeros(1)
    return torch.minimum(index, last), valid, num


def padded(
    values: torch.Tensor, index: torch.Tensor, valid: torch.Tensor, fill: float | bool
) -> torch.Tensor:
    """[T] -> [B, S] with ``fill`` in invalid slots."""
    if values.numel() == 0:
        return torch.full(index.shape, fill, dtype=values.dtype, device=values.device)
    return torch.where(valid, values[index], torch.full_like(values[index], fill))


def leading_run(accept: torch.Tensor) -> torch.Tensor:  # [B, S] bool -> [B] int64
    """Length of the leading run of True."""
    return torch.cumprod(accept.to(torch.int64), dim=1).sum(dim=1)


def last_true(ok: torch.Tensor) -> torch.Tensor:  # [B, S] bool -> [B] int64
    """Largest i in 1..S with ``ok[:, i - 1]``, 0 when none."""
    if ok.shape[1] == 0:
        return torch.zeros(ok.shape[0], dtype=torch.int64, device=ok.device)
    slot = torch.arange(1, ok.shape[1] + 1, device=ok.device, dtype=torch.int64)[None, :]  # [1, S]
    return torch.where(ok, slot, torch.zeros_like(slot)).amax(dim=1)


def draft_p_q(
    draft_ids: torch.Tensor,  # [T]
    draft_probs: torch.Tensor | None,  # [T, V]
    target_probs: torch.Tensor,  # [N, V]
    target_rows: torch.Tensor,  # [T]
) -> tuple[torch.Tensor, torch.Tensor]:  # p(x) [T] float64, q(x) [T] float64
    """p(x) and q(x) of each draft: q = 1 for point masses, and a null draft (-1) has p = q = 0 (it can
    never pass, and is never used as an index)."""
    ids = draft_ids.to(torch.int64)
    real, safe = ids >= 0, ids.clamp(min=0)  # [T]
    zero = torch.zeros(ids.shape[0], dtype=torch.float64, device=ids.device)
    p_x = torch.where(real, target_probs[target_rows.to(torch.int64), safe].to(torch.float64), zero)
    if draft_probs is None:
        return p_x, real.to(torch.float64)
    tokens = torch.arange(ids.shape[0], device=ids.device)
    return p_x, torch.where(real, draft_probs[tokens, safe].to(torch.float64), zero)


def draft_ratios(
    draft_ids: torch.Tensor,  # [T]
    draft_probs: torch.Tensor | None,  # [T, V]
    target_probs: torch.Tensor,  # [N, V]
    target_rows: torch.Tensor,  # [T]
) -> torch.Tensor:  # [T] float64
    """ρ = p(x)/q(x) with ρ = 0 where p(x) = 0 and ρ = inf where q(x) = 0 < p(x); ρ = 0 for a null draft."""
    p_x, q_x = draft_p_q(draft_ids, draft_probs, target_probs, target_rows)  # [T], [T]
    if draft_probs is None:
        return p_x
    return torch.where(p_x > 0, p_x / q_x, torch.zeros_like(p_x))


def relaxed_ratios(ratios: torch.Tensor, thresholds: torch.Tensor | None) -> torch.Tensor:  # [T] float64
    """Entropy verify's relaxation ρ → ρ/τ (keeps ρ = 0 at 0)."""
    if thresholds is None:
        return ratios
    return torch.where(ratios > 0, ratios / thresholds, torch.zeros_like(ratios))


def block_weights(
    ratios: torch.Tensor,  # [T] float64
    index: torch.Tensor,  # [B, S]
    valid: torch.Tensor,  # [B, S]
) -> torch.Tensor:  # [B, S + 1] float64: b_0 = 1, b_i = min(1, b_{i-1}·ρ_i) (b stays 0 once 0)
    """Block verification weights after accepting i drafts, i = 0..S (padded slots repeat the last)."""
    rho = padded(ratios, index, valid, 1.0)  # [B, S]
    weights = [torch.ones(index.shape[0], dtype=torch.float64, device=index.device)]
    for j in range(index.shape[1]):
        prev = weights[-1]
        step = torch.where(prev > 0, torch.clamp(prev * rho[:, j], max=1.0), torch.zeros_like(prev))
        weights.append(step)
    return torch.stack(weights, dim=1)


def residual_mass(
    target_probs: torch.Tensor,  # [N, V] float32
    target_rows: torch.Tensor,  # [T]
    draft_probs: torch.Tensor | None,  # [T, V]
    draft_ids: torch.Tensor,  # [T]
    scale: torch.Tensor,  # [T] float64
) -> torch.Tensor:  # [T] float64: r = Σ_v max(b·p(v) − q(v), 0), accumulated in float32
    """Residual mass of each draft row at weight b."""
    p = target_probs[target_rows.to(torch.int64)]  # [T, V]
    w = scale.to(torch.float32)[:, None] * p
    real = (draft_ids >= 0)[:, None]  # [T, 1] a null draft (-1) has q = 0
    if draft_probs is None:
        ids = draft_ids.to(torch.int64).clamp(min=0)[:, None]  # [T, 1]
        w = w.scatter_add(1, ids, -real.to(w.dtype))
    else:
        w = w - torch.where(real, draft_probs.to(torch.float32), torch.zeros_like(w))
    return torch.clamp(w, min=0).sum(dim=1).to(torch.float64)


def block_thresholds(
    weights: torch.Tensor,  # [B, S + 1] float64
    residual: torch.Tensor,  # [T] float64, residual mass of each draft row at its weight b_{slot}
    index: torch.Tensor,  # [B, S]
    valid: torch.Tensor,  # [B, S]
    num: torch.Tensor,  # [B]
) -> torch.Tensor:  # [B, S] float64: column j holds h_{j+1}
    """h_i = r_i / (r_i + 1 − b_i) for 1 <= i < K (1 when the denominator is 0), h_K = b_K."""
    steps = index.shape[1]
    if steps == 0:
        return weights[:, :0]
    b = weights[:, 1:]  # [B, S] b_i for i = 1..S
    r_next = padded(residual, torch.clamp(index + 1, max=max(int(residual.numel()) - 1, 0)), valid, 0.0)
    denom = r_next + (1.0 - b)
    h = torch.where(
        denom > 0, r_next / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.ones_like(b)
    )
    slot = torch.arange(1, steps + 1, device=index.device)[None, :]  # [1, S] i = j + 1
    return torch.where(slot == num[:, None], b, h)


#: elements of one tile of the exponential race (int64 hash buffers of 2 MiB each stay in cache)
RACE_TILE_ELEMENTS = 1 << 18


def exponential_race(
    w: torch.Tensor, key: torch.Tensor, tile_elements: int = RACE_TILE_ELEMENTS
) -> torch.Tensor:  # [R, V], [R, 1] -> [R] int64
    """Sample each row of ``w`` (non-negative weights, any scale) as ``argmax_v w[v] / -log(u_v)``.

    ``u_v = vocab_uniform_f32`` under the row's ``key``: the same value, element for element, as the
    one-shot ``argmax(w / -log(vocab_uniform_f32(...)))``, computed over vocabulary tiles with reused
    buffers so that the per-vocabulary hash streams through cache instead of memory. Ties keep the
    lowest index, as ``torch.argmax`` does.
    """
    rows, vocab = w.shape
    cols = max(256, min(vocab, tile_elements // max(rows, 1)))
    buf = torch.empty((rows, cols), dtype=torch.int64, device=w.device)  # [R, C]
    scratch = torch.empty_like(buf)  # [R, C]
    best = torch.full((rows,), -1.0, dtype=torch.float32, device=w.device)  # [R] every score is >= 0
    best_idx = torch.zeros(rows, dtype=torch.int64, device=w.device)  # [R]
    for start in range(0, vocab, cols):
        width = min(cols, vocab - start)
        u = rng.vocab_uniform_f32_into(key, start, buf[:, :width], scratch[:, :width])  # [R, C]
        val, idx = (w[:, start : start + width] / u.log_().neg_()).max(dim=1)  # [R]
        better = val > best
        best = torch.where(better, val, best)
        best_idx = torch.where(better, idx + start, best_idx)
    return best_idx


class TorchSamplerOps(TorchTreeOps, TorchGbvOps):
    """Reference implementation of ``SamplerOps`` (see ``spec_backend.sampling.ops`` for the contract)."""

    name = "torch"

    def target_probs(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        apply_top_k: bool,
        apply_top_p: bool,
        max_top_k: int | None = None,
    ) -> torch.Tensor:
        del max_top_k  # the reference filter has no k limit
        return _probs.target_probs(logits, temperature, top_k, top_p, apply_top_k, apply_top_p)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.argmax(logits, dim=-1)

    def entropy_thresholds(self, logits: torch.Tensor, alpha: float, threshold: float) -> torch.Tensor:
        return _probs.entropy_thresholds(logits, alpha, threshold)

    def uniforms(
        self, seeds: torch.Tensor, positions: torch.Tensor, counters: torch.Tensor, stream: int
    ) -> torch.Tensor:
        return rng.uniform_f64(seeds, positions, counters, stream)

    def greedy_verify(
        self,
        draft_ids: torch.Tensor,
        target_argmax: torch.Tensor,
        cu_num_draft_tokens: torch.Tensor,
        max_spec_len: int,
    ) -> torch.Tensor:
        index, valid, _ = request_layout(cu_num_draft_tokens, max_spec_len)
        match = draft_ids.to(torch.int64) == target_argmax.to(torch.int64)  # [T]
        return leading_run(padded(match, index, valid, False))

    def standard_verify(
        self,
        draft_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        target_rows: torch.Tensor,
        uniforms: torch.Tensor,
        thresholds: torch.Tensor | None,
        cu_num_draft_tokens: torch.Tensor,
        max_spec_len: int,
    ) -> torch.Tensor:
        index, valid, _ = request_layout(cu_num_draft_tokens, max_spec_len)
        if thresholds is None:  # lossless: u < ρ, with ρ = inf when q(x) = 0 < p(x)
            rho = draft_ratios(draft_ids, draft_probs, target_probs, target_rows)  # [T]
            return leading_run(padded(uniforms < rho, index, valid, False))
        p_x, q_x = draft_p_q(draft_ids, draft_probs, target_probs, target_rows)  # [T], [T]
        accept = (q_x > 0) & (p_x / torch.where(q_x > 0, q_x, 1.0) >= thresholds * uniforms)  # vllm-ascend
        return leading_run(padded(accept, index, valid, False))

    def cumulative_verify(
        self,
        draft_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        target_rows: torch.Tensor,
        uniforms: torch.Tensor,
        thresholds: torch.Tensor | None,
        cu_num_draft_tokens: torch.Tensor,
        max_spec_len: int,
    ) -> torch.Tensor:
        index, valid, _ = request_layout(cu_num_draft_tokens, max_spec_len)
        p_x, q_x = draft_p_q(draft_ids, draft_probs, target_probs, target_rows)  # [T], [T]
        p_pad, q_pad = padded(p_x, index, valid, 1.0), padded(q_x, index, valid, 1.0)  # [B, S]
        cum_u = torch.cumprod(padded(uniforms, index, valid, 1.0), dim=1)  # [B, S] Π_{j<=i} u_j
        if thresholds is not None:
            cum_u = padded(thresholds, index, valid, 1.0) * cum_u  # the current position's τ only
        pi = torch.ones(index.shape[0], dtype=torch.float64, device=index.device)  # [B]
        passes = []
        for j in range(index.shape[1]):  # π_i = min(π_{i-1}·p/q, 1): NaN (0·inf, 0/0) stays NaN, never passes
            pi = torch.minimum(pi * p_pad[:, j] / q_pad[:, j], torch.ones_like(pi))
            passes.append((q_pad[:, j] > 0) & (pi >= cum_u[:, j]))
        ok = torch.stack(passes, dim=1) if passes else valid  # [B, S]
        return last_true(ok & valid)  # the last passing position: every draft up to it is accepted

    def block_verify(
        self,
        draft_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        target_rows: torch.Tensor,
        uniforms: torch.Tensor,
        thresholds: torch.Tensor | None,
        cu_num_draft_tokens: torch.Tensor,
        max_spec_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        index, valid, num = request_layout(cu_num_draft_tokens, max_spec_len)
        rho = relaxed_ratios(draft_ratios(draft_ids, draft_probs, target_probs, target_rows), thresholds)
        weights = block_weights(rho, index, valid)  # [B, S + 1]
        req_of, slot_of = self._slots(cu_num_draft_tokens, draft_ids.shape[0])
        b_before = weights[req_of, slot_of]  # [T] weight b_j of draft row j
        residual = residual_mass(target_probs, target_rows, draft_probs, draft_ids, b_before)  # [T]
        h = block_thresholds(weights, residual, index, valid, num)  # [B, S]
        eta = padded(uniforms, index, valid, 1.0)  # [B, S]
        tau = last_true((eta < h) & valid)  # [B] the last i with η_i < h_i (i = 0 always qualifies)
        return tau, weights.gather(1, tau[:, None]).squeeze(1)

    def synthetic_verify(
        self,
        uniforms: torch.Tensor,
        rates: torch.Tensor,
        cu_num_draft_tokens: torch.Tensor,
        max_spec_len: int,
    ) -> torch.Tensor:
        _, valid, _ = request_layout(cu_num_draft_tokens, max_spec_len)
        passed = uniforms[:, None] < rates[None, :max_spec_len].to(torch.float64)  # [B, S]
        return (passed & valid).sum(dim=1)

    def sample_residual(
        self,
        target_probs: torch.Tensor,
        target_rows: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_ids: torch.Tensor,
        draft_rows: torch.Tensor,
        scale: torch.Tensor,
        seeds: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        p = target_probs[target_rows.to(torch.int64)]  # [R, V] float32
        rows = torch.clamp(draft_rows.to(torch.int64), min=0)  # [R]
        w = scale.to(torch.float32)[:, None] * p  # [R, V]
        if draft_ids.numel():
            x = draft_ids.to(torch.int64)[rows]  # [R]
            has_draft = (draft_rows >= 0) & (x >= 0)  # [R] null drafts (-1) have q = 0
            if draft_probs is None:
                q = torch.zeros_like(w).scatter(1, x.clamp(min=0)[:, None], 1.0)
            else:
                q = draft_probs[rows].to(torch.float32)
            w = torch.clamp(w - torch.where(has_draft[:, None], q, torch.zeros_like(q)), min=0)
        empty = w.sum(dim=1, keepdim=True) <= 0  # [R, 1]
        w = torch.where(empty, p, w)
        return exponential_race(w, rng.row_key(seeds, positions, rng.STREAM_SAMPLE)[:, None])

    @staticmethod
    def _requests(cu_num_draft_tokens: torch.Tensor, total: int) -> torch.Tensor:  # [T] int64
        tokens = torch.arange(total, device=cu_num_draft_tokens.device, dtype=torch.int64)
        return torch.searchsorted(cu_num_draft_tokens.to(torch.int64), tokens, right=True)

    @classmethod
    def _slots(cls, cu_num_draft_tokens: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        cu = cu_num_draft_tokens.to(torch.int64)
        req = cls._requests(cu, total)  # [T]
        num = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
        tokens = torch.arange(total, device=cu.device, dtype=torch.int64)
        return req, tokens - (cu - num)[req]


__all__ = [
    "TorchSamplerOps",
    "block_thresholds",
    "block_weights",
    "draft_p_q",
    "draft_ratios",
    "exponential_race",
    "last_true",
    "leading_run",
    "padded",
    "relaxed_ratios",
    "request_layout",
    "residual_mass",
]
