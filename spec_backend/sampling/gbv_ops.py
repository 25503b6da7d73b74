"""Greedy multi-path block verification (``SamplerOps.gbv_verify``; ``verify_rules.TREE_REGISTRY``'s
``gbv``), in float64 on the host, one request at a time: the torch op, which the triton ops run too.

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

import torch

from spec_backend.sampling.tree_ops import children, greedy_path, inverse_cdf


def order_key(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:  # [V] float64
    """``ρ = p/q`` (``+inf`` where only ``q`` is 0, 0 where both are)."""
    inf = torch.full_like(p, float("inf"))
    return torch.where(q > 0, p / torch.where(q > 0, q, 1.0), torch.where(p > 0, inf, torch.zeros_like(p)))


def skew_row(
    p: torch.Tensor, q: torch.Tensor, above: float, mass: float, paths: int
) -> tuple[torch.Tensor, torch.Tensor]:  # q^Γ [V], cdf [V] (inclusive, in the order), both float64
    """``q^Γ`` after a prefix of draft mass ``mass`` with ``above`` ranked below it: ``q · Σ_i a^i b^(K−1−i)``
    normalised, ``a, b`` the prefix's cumulative masses through and before each token over ``A + x``."""
    order = torch.sort(order_key(p, q), stable=True).indices  # [V]
    cdf = torch.empty_like(q)
    cdf[order] = torch.cumsum(q[order], 0)
    scale = above + mass
    hi, lo = (above + mass * cdf) / scale, (above + mass * (cdf - q)) / scale  # [V] in [0, 1]
    series = sum(hi**i * lo ** (paths - 1 - i) for i in range(paths))
    weight = q * series
    total = float(weight.sum())
    return (weight / total if total > 0 else q), cdf


class TorchGbvOps:
    """``SamplerOps.gbv_verify`` (module docstring)."""

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
        path = torch.full((batch, m), -1, dtype=torch.int64)
        final = torch.zeros(batch, dtype=torch.int64)
        host_parents, host_tokens = parents.tolist(), tokens.tolist()
        starts, greedy_host, u = row_start.tolist(), greedy.tolist(), uniforms.double().cpu()
        argmax = target_argmax.tolist() if target_argmax is not None else None
        for b in range(batch):
            kids = children(host_parents[b])
            if greedy_host[b]:
                assert argmax is not None, "a greedy request needs target_argmax"
                nodes, last = greedy_path(kids, host_tokens[b], argmax, starts[b])
            else:
                if draft_probs is None and kids:
                    raise ValueError("gbv_verify needs draft_probs for a sampled request with drafts")
                rows = target_probs[starts[b] : starts[b] + 1 + m].double().cpu()  # [<= M + 1, V]
                q = draft_probs[b].double().cpu() if draft_probs is not None else rows[:0]  # [M, V]
                nodes, last = _verify_one(kids, host_tokens[b], rows, q, u[b], paths)
            path[b, : len(nodes)] = torch.tensor(nodes, dtype=torch.int64)
            final[b] = last
        return path.to(parents.device), final.to(parents.device)


def _select(
    kids: dict[int, list[int]], tokens: list[int], rows: torch.Tensor, q: torch.Tensor, paths: int
) -> tuple[list[int], list[torch.Tensor]]:  # the selected path's nodes, q^Γ before each
    node, above, mass = -1, 0.0, 1.0
    nodes: list[int] = []
    skewed: list[torch.Tensor] = []
    while kids.get(node):
        p, qn = rows[1 + node], q[kids[node][0]]  # [V], [V]: the target and the draft after ``node``
        row, cdf = skew_row(p, qn, above, mass, paths)
        rank = torch.empty_like(p)
        rank[torch.sort(order_key(p, qn), stable=True).indices] = torch.arange(len(p), dtype=p.dtype)
        child = max(kids[node], key=lambda c: float(rank[tokens[c]]))
        x = tokens[child]
        above, mass = above + mass * float(cdf[x] - qn[x]), mass * float(qn[x])
        nodes.append(child)
        skewed.append(row)
        node = child
    return nodes, skewed


def _verify_one(
    kids: dict[int, list[int]],
    tokens: list[int],
    rows: torch.Tensor,  # [M + 1, V] float64: the root's row, then each node's
    q: torch.Tensor,  # [M, V] float64
    u: torch.Tensor,  # [M + 1] float64
    paths: int,
) -> tuple[list[int], int]:
    nodes, skewed = _select(kids, tokens, rows, q, paths)
    weight, weights, accept = 1.0, [1.0], [1.0]  # w_0 = 1; h_0 = 1 (τ = 0 is always possible)
    for i, node in enumerate(nodes):
        p_here, g = float(rows[1 + (nodes[i - 1] if i else -1)][tokens[node]]), float(skewed[i][tokens[node]])
        weight = min(1.0, weight * p_here / g) if g > 0 and weight > 0 else 0.0
        weights.append(weight)
        if i + 1 < len(nodes):
            r = float(torch.clamp(weight * rows[1 + node] - skewed[i + 1], min=0).sum())
            denom = r + 1.0 - weight
            accept.append(1.0 if denom <= 0 else r / denom)
        else:
            accept.append(weight)
    tau = max((i for i in range(1, len(nodes) + 1) if float(u[nodes[i - 1]]) <= accept[i]), default=0)
    after = nodes[tau - 1] if tau else -1
    p = rows[1 + after]  # [V]
    if tau == len(nodes):
        return nodes[:tau], inverse_cdf(p, [], float(u[-1]))
    residual = torch.clamp(weights[tau] * p - skewed[tau], min=0)  # [V]
    return nodes[:tau], inverse_cdf(residual if float(residual.sum()) > 0 else p, [], float(u[-1]))


__all__ = ["TorchGbvOps", "order_key", "skew_row"]
