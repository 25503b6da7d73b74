"""Greedy multi-path block verification (``SamplerOps.gbv_verify``; ``verify_rules.TREE_REGISTRY``'s
``gbv``): the torch op, in float64 on the batch's device, one pass per depth over every request (the
triton ops run it too); ``sampling.gbv_reference`` is the same rule one request at a time on the host,
which it is checked against token for token.

Layout as ``sampling.tree_ops``: ``parents [B, M]`` (``-1`` the root, ``-2`` past a request's nodes),
``tokens [B, M]``, the target's rows of request ``b`` at ``row_start[b]`` (the root) and ``row_start[b] + 1
+ i`` (after node ``i``), and ``draft_probs [B, M, V]``: the draft distribution node ``i`` was drawn from
(``q`` after its parent's path; every child of a node carries the same row). The nodes are the trie of
``paths`` i.i.d. draft paths.

The rule (``spec_backend.testing.gbv_spec`` is its float64 law): walk from the root to the greatest
drafted path — at each node the drafted child of highest rank in the order of ``ρ = p/q`` (ties by token
id) — computing the skewed draft ``q^Γ`` of each node on the way; then block verification of that path
against ``p`` with ``q^Γ``: weights ``w_i = min(1, w_{i−1}·p(x_i)/q^Γ(x_i))``, ``h_i = r_i / (r_i + 1 − w_i)``
with ``r_i = Σ max(w_i·p − q^Γ, 0)`` after ``x_i`` (``h_L = w_L``), ``τ`` the deepest ``i`` with
``u_{node i} <= h_i`` (0 if none); the final token from ``norm(max(w_τ·p − q^Γ, 0))`` after ``x_τ`` (the
target's row after a whole accepted path) by ``u_final``'s inverse CDF. Greedy requests follow the
target's argmax down the trie.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_backend.sampling.tree_ops import NO_NODE


def order_key(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:  # [V] float64
    """``ρ = p/q`` (``+inf`` where only ``q`` is 0, 0 where both are)."""
    inf = torch.full_like(p, float("inf"))
    return torch.where(q > 0, p / torch.where(q > 0, q, 1.0), torch.where(p > 0, inf, torch.zeros_like(p)))


def skew_rows(
    p: torch.Tensor,  # [B, V] float64
    q: torch.Tensor,  # [B, V] float64
    above: torch.Tensor,  # [B] float64: A, the draft mass ranked below the prefix
    mass: torch.Tensor,  # [B] float64: x, the prefix's draft mass
    paths: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # q^Γ [B, V], cdf [B, V] (inclusive, in the order)
    """``q^Γ`` after each row's prefix: ``q · Σ_i a^i b^(K−1−i)`` normalised, ``a, b`` the cumulative
    masses through and before each token over ``A + x`` (the difference of powers over ``a − b``)."""
    order = torch.sort(order_key(p, q), dim=-1, stable=True).indices  # [B, V]
    cdf = torch.empty_like(q).scatter_(1, order, torch.cumsum(q.gather(1, order), dim=-1))
    a, x = above[:, None], mass[:, None]  # [B, 1]
    scale = torch.where(a + x > 0, a + x, torch.ones_like(a))
    hi, lo = (a + x * cdf) / scale, (a + x * (cdf - q)) / scale  # [B, V] in [0, 1]
    series = sum((hi**i * lo ** (paths - 1 - i) for i in range(paths)), torch.zeros_like(q))
    weight = q * series  # [B, V]
    total = weight.sum(dim=-1, keepdim=True)  # [B, 1]
    return torch.where(total > 0, weight / torch.where(total > 0, total, 1.0), q), cdf


def _inverse_cdf(mass: torch.Tensor, u: torch.Tensor) -> torch.Tensor:  # [B, V], [B] -> [B] int64
    """Per row, the first token whose running sum exceeds ``u`` of the total (the last token of positive
    mass where rounding leaves none): ``tree_ops.inverse_cdf`` batched."""
    cdf = torch.cumsum(mass, dim=-1)  # [B, V]
    hit = (cdf > u[:, None] * cdf[:, -1:]) & (mass > 0)
    vocab = torch.arange(mass.shape[1], device=mass.device)
    last = torch.where(mass > 0, vocab, -1).amax(dim=-1)  # [B]
    return torch.where(hit.any(dim=-1), hit.int().argmax(dim=-1), last.clamp_min(0))


class TorchGbvOps:
    """``SamplerOps.gbv_verify`` (module docstring) for a whole batch on its device: one pass per depth
    over every request (no host loop, no read back before the result)."""

    def gbv_verify(
        self,
        parents: torch.Tensor,  # [B, M] int64
        tokens: torch.Tensor,  # [B, M] int64
        target_probs: torch.Tensor,  # [N, V] float32
        target_argmax: torch.Tensor | None,  # [N] int64 (None: no greedy request)
        row_start: torch.Tensor,  # [B] int64
        greedy: torch.Tensor,  # [B] bool
        uniforms: torch.Tensor,  # [B, M + 1] float64: per node, then the final token's
        draft_probs: torch.Tensor | None = None,  # [B, M, V]: the q each node was drawn from
        paths: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # path [B, M] int64 (-1 past), final [B] int64
        """Verify every request's trie of ``paths`` draft paths (module docstring)."""
        if paths < 1:
            raise ValueError(f"gbv_verify needs paths >= 1, got {paths}")
        batch, m = parents.shape
        if draft_probs is None and bool((~greedy[:, None] & (parents != NO_NODE)).any()):
            raise ValueError("gbv_verify needs draft_probs for a sampled request with drafts")
        argmax = target_argmax if target_argmax is not None else target_probs.argmax(dim=-1)  # [N]
        depth = int(_depths(parents).amax()) if m else 0  # the one read: how many levels to walk
        walk = _walk(parents, tokens, target_probs, argmax, row_start, greedy, draft_probs, paths, depth)
        path, final = _block_verify(walk, tokens, uniforms.double(), greedy, argmax, row_start)
        return torch.cat([path, path.new_full((batch, m - depth), -1)], dim=1), final


def _depths(parents: torch.Tensor) -> torch.Tensor:  # [B, M] -> [B, M] int64 (0 for padding)
    """Each node's depth (parents precede children)."""
    depth = torch.zeros_like(parents)
    for i in range(parents.shape[1]):
        above = depth.gather(1, parents[:, i : i + 1].clamp_min(0))[:, 0]  # [B]
        depth[:, i] = torch.where(parents[:, i] == -1, 1, torch.where(parents[:, i] >= 0, above + 1, 0))
    return depth


@dataclass(frozen=True)
class _Walk:
    """The selected path of every request: ``nodes [B, D]`` (-1 past its length), the target's rows
    before each depth's token and after the last (``p_at [B, D + 1, V]``), ``q^Γ`` at each depth
    (``skewed [B, D, V]``)."""

    nodes: torch.Tensor
    p_at: torch.Tensor
    skewed: torch.Tensor


def _walk(
    parents: torch.Tensor,  # [B, M]
    tokens: torch.Tensor,  # [B, M]
    probs: torch.Tensor,  # [N, V] float32
    argmax: torch.Tensor,  # [N]
    starts: torch.Tensor,  # [B]
    greedy: torch.Tensor,  # [B] bool
    q_all: torch.Tensor | None,  # [B, M, V] float32 (None: greedy requests only)
    paths: int,
    depth: int,
) -> _Walk:
    """From the root, each depth's drafted child of highest rank (greedy: the target's argmax); only the
    rows on the walk are read, in float64."""
    batch, vocab, f64 = parents.shape[0], probs.shape[1], torch.float64
    rows = torch.arange(batch, device=parents.device)
    node = torch.full((batch,), -1, dtype=torch.int64, device=parents.device)  # [B]
    above, mass = probs.new_zeros(batch, dtype=f64), probs.new_ones(batch, dtype=f64)  # [B] A and x
    alive = torch.ones(batch, dtype=torch.bool, device=parents.device)
    nodes = torch.full((batch, depth), -1, dtype=torch.int64, device=parents.device)
    p_at = probs.new_zeros((batch, depth + 1, vocab), dtype=f64)
    skewed = probs.new_zeros((batch, depth, vocab), dtype=f64)
    ranks = torch.arange(vocab, dtype=f64, device=probs.device).expand(batch, -1)  # [B, V]
    for d in range(depth):
        p = probs[starts + 1 + node].to(f64)  # [B, V] the target after the current node (-1: the root's)
        kids = (parents == node[:, None]) & alive[:, None]  # [B, M]
        # [B, V] any child's row: the q after the node
        q = q_all[rows, kids.int().argmax(dim=1)].to(f64) if q_all is not None else torch.zeros_like(p)
        g, cdf = skew_rows(p, q, above, mass, paths)
        rank = torch.empty_like(p).scatter_(
            1, torch.sort(order_key(p, q), dim=-1, stable=True).indices, ranks
        )
        score = torch.where(kids, rank.gather(1, tokens.clamp_min(0)), -1.0)  # [B, M]
        match = kids & (tokens == argmax[starts + 1 + node][:, None])  # [B, M]
        has = torch.where(greedy, match.any(dim=1), kids.any(dim=1))
        child = torch.where(greedy, match.int().argmax(dim=1), score.argmax(dim=1))  # [B] first of ties
        x = tokens[rows, child]
        qx, below = q[rows, x], cdf[rows, x] - q[rows, x]
        above, mass = torch.where(has, above + mass * below, above), torch.where(has, mass * qx, mass)
        p_at[:, d], skewed[:, d] = p, g
        nodes[:, d] = torch.where(has, child, -1)
        node, alive = torch.where(has, child, node), has
    p_at[:, depth] = probs[starts + 1 + node].to(f64)
    return _Walk(nodes, p_at, skewed)


__all__ = ["TorchGbvOps", "order_key", "skew_rows"]


def _block_verify(
    walk: _Walk,
    tokens: torch.Tensor,  # [B, M]
    u: torch.Tensor,  # [B, M + 1] float64
    greedy: torch.Tensor,  # [B] bool
    argmax: torch.Tensor,  # [N]
    starts: torch.Tensor,  # [B]
) -> tuple[torch.Tensor, torch.Tensor]:  # path [B, D], final [B]
    """Block verification of each selected path against ``p`` with ``q^Γ`` (module docstring)."""
    nodes, p_at, skewed = walk.nodes, walk.p_at, walk.skewed
    batch, depth = nodes.shape
    length = (nodes >= 0).sum(dim=1)  # [B]
    x = tokens.gather(1, nodes.clamp_min(0))  # [B, D]
    px = p_at[:, :depth].gather(2, x[..., None])[..., 0]  # [B, D] p(x_d | X^(d-1))
    gx = skewed.gather(2, x[..., None])[..., 0]  # [B, D]
    weights = [p_at.new_ones(batch)]  # w_0 = 1
    for d in range(depth):
        w = weights[-1]
        ok = (gx[:, d] > 0) & (w > 0)
        weights.append(
            torch.where(ok, torch.clamp(w * px[:, d] / torch.where(ok, gx[:, d], 1.0), max=1.0), 0.0)
        )
    w_all = torch.stack(weights, dim=1)  # [B, D + 1]
    r = torch.clamp(w_all[:, 1:depth, None] * p_at[:, 1:depth] - skewed[:, 1:depth], min=0).sum(dim=-1)
    denom = r + 1.0 - w_all[:, 1:depth]  # [B, D - 1]
    h = torch.cat(
        [torch.where(denom <= 0, 1.0, r / torch.where(denom <= 0, 1.0, denom)), r.new_zeros(batch, 1)], 1
    )
    level = torch.arange(1, depth + 1, device=nodes.device)[None, :]  # [1, D]
    h = torch.where(level == length[:, None], w_all[:, 1:], h)  # h_L = w_L
    accepted = (level <= length[:, None]) & (u.gather(1, nodes.clamp_min(0)) <= h)  # [B, D]
    tau = torch.where(greedy, length, (accepted * level).amax(dim=1) if depth else length)  # [B]
    rows = torch.arange(batch, device=nodes.device)
    after = p_at[rows, tau]  # [B, V] the target after X^tau
    g_tau = skewed[rows, tau.clamp(max=max(depth - 1, 0))] if depth else after  # [B, V]
    residual = torch.clamp(w_all[rows, tau][:, None] * after - g_tau, min=0)  # [B, V]
    use = (tau < length) & (residual.sum(dim=-1) > 0)
    final = _inverse_cdf(torch.where(use[:, None], residual, after), u[:, -1])
    at = (tau - 1).clamp_min(0)[:, None]  # [B, 1]
    last = torch.where(tau > 0, nodes.gather(1, at)[:, 0], -1) if depth else torch.full_like(tau, -1)  # [B]
    final = torch.where(greedy, argmax[starts + 1 + last], final)
    return torch.where(level < tau[:, None] + 1, nodes, -1), final
