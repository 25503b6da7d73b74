"""The per-request host reference of ``SamplerOps.gbv_verify`` (``sampling.gbv_ops``: the batched op
is checked against it, token for token on the same uniforms): the same rule, one request at a time in
float64 on the host, written as the module docstring of ``sampling.gbv_ops`` reads.
"""

from __future__ import annotations

import torch

from spec_backend.sampling.gbv_ops import order_key, skew_rows
from spec_backend.sampling.tree_ops import children, greedy_path, inverse_cdf


def gbv_reference(
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
        rows_g, cdfs = skew_rows(p[None], qn[None], torch.tensor([above]), torch.tensor([mass]), paths)
        row, cdf = rows_g[0], cdfs[0]
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


__all__ = ["gbv_reference"]
