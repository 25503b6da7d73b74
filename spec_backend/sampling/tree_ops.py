"""The token-tree verification op (``SamplerOps.tree_verify``) in torch, for a batch of trees
(``verify_rules.TREE_REGISTRY``'s ``point_mass`` and ``rrs`` rules; the triton op in
``sampling.triton.tree`` matches it on the same uniforms).

Layout (every request padded to ``M`` nodes): ``parents [B, M]`` (``-1`` the root, ``-2`` past the
request's nodes), ``tokens [B, M]``, and the target's rows of request ``b`` at ``row_start[b]`` (the
root) and ``row_start[b] + 1 + i`` (after node ``i``); with sampled siblings (``rrs``), ``draft_probs
[B, M, V]``: the distribution node ``i`` was drawn from given its earlier siblings, and the rule is
``sampling.tree_verify.verify_tree``'s (accept ``x`` when ``u · q_i(x) < r(x)``, else ``r ←
norm(max(r − q_i, 0))``). The rest of this docstring is the point-mass rule (no ``draft_probs``).

The rule, per request, from the root: the children of the current node are tried in order; with ``S``
the target probability of the distinct tokens already rejected there, child ``x`` is accepted when
``u · (1 − S) < p(x)`` — ``u < r(x)`` for the residual ``r = norm(p without the rejected tokens)``, as
``sampling.tree_verify.verify_tree`` computes it with point masses — and a child repeating a rejected
token is rejected. When none is accepted (or the node is a leaf) the final token is the first ``v`` whose
running sum of ``r``'s mass exceeds ``u_final`` of the total (``inverse_cdf``). Greedy requests follow the
target's argmax (``target_argmax``, from the logits) instead.
"""

from __future__ import annotations

import torch

from spec_backend.sampling.tree_verify import verify_tree

#: ``parents`` entry of a padding node (past a request's count)
NO_NODE = -2


def repeated_siblings(parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # [B, M] bool
    """Whether node ``i`` repeats the token of an earlier sibling (it is then never accepted)."""
    same = (parents[:, :, None] == parents[:, None, :]) & (tokens[:, :, None] == tokens[:, None, :])
    earlier = torch.ones(parents.shape[1], parents.shape[1], dtype=torch.bool, device=parents.device).tril(-1)
    return (same & earlier).any(dim=2) & (parents != NO_NODE)  # [B, M]


class TorchTreeOps:
    """``SamplerOps.tree_verify`` (module docstring), one request at a time on the host."""

    def tree_verify(
        self,
        parents: torch.Tensor,  # [B, M] int64
        tokens: torch.Tensor,  # [B, M] int64
        target_probs: torch.Tensor,  # [N, V] float32
        target_argmax: torch.Tensor | None,  # [N] int64 (None: no greedy request)
        row_start: torch.Tensor,  # [B] int64
        greedy: torch.Tensor,  # [B] bool
        uniforms: torch.Tensor,  # [B, M + 1] float64: per node, then the final token's
        draft_probs: torch.Tensor | None = None,  # [B, M, V]: node i's q given its earlier siblings
    ) -> tuple[torch.Tensor, torch.Tensor]:  # path [B, M] int64 (-1 past), final [B] int64
        """Verify every request's tree (module docstring)."""
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
            elif draft_probs is not None:  # sampled siblings: ``verify_tree``'s rule on this request
                n = sum(1 for p in host_parents[b] if p != NO_NODE)
                rows = target_probs[starts[b] : starts[b] + 1 + n]  # [n + 1, V]
                got = verify_tree(host_parents[b][:n], host_tokens[b][:n], rows, draft_probs[b, :n].cpu(),
                                  u[b, :n].tolist(), float(u[b, -1]))  # fmt: skip
                nodes, last = got.path, got.final_token
            else:
                nodes, last = _sampled_path(kids, host_tokens[b], target_probs, starts[b], u[b])
            path[b, : len(nodes)] = torch.tensor(nodes, dtype=torch.int64)
            final[b] = last
        return path.to(parents.device), final.to(parents.device)


def children(parents: list[int]) -> dict[int, list[int]]:
    """Each node's children in order (``-1``: the root's), padding nodes left out."""
    kids: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        if parent != NO_NODE:
            kids.setdefault(parent, []).append(i)
    return kids


def greedy_path(
    kids: dict[int, list[int]], tokens: list[int], argmax: list[int], start: int
) -> tuple[list[int], int]:
    node, nodes = -1, list[int]()
    while True:
        best = argmax[start + 1 + node]
        match = [c for c in kids.get(node, []) if tokens[c] == best]
        if not match:
            return nodes, best
        node = match[0]
        nodes.append(node)


def _sampled_path(
    kids: dict[int, list[int]], tokens: list[int], probs: torch.Tensor, start: int, u: torch.Tensor
) -> tuple[list[int], int]:
    node, nodes = -1, list[int]()
    while True:
        row = probs[start + 1 + node].double()  # [V]
        rejected: list[int] = []
        mass = 0.0  # S: the target probability of the distinct rejected tokens
        accepted = None
        for child in kids.get(node, []):
            x = tokens[child]
            if x in rejected:
                continue
            p = float(row[x])
            if float(u[child]) * (1.0 - mass) < p:
                accepted = child
                break
            rejected.append(x)
            mass += p
        if accepted is None:
            return nodes, inverse_cdf(row, rejected, float(u[-1]))
        node = accepted
        nodes.append(node)


def inverse_cdf(row: torch.Tensor, rejected: list[int], u: float) -> int:  # row [V] float64
    """The first token whose running sum of the residual mass exceeds ``u`` of its total (the last
    token of positive mass where rounding leaves none)."""
    mass = row.clone()
    if rejected:
        mass[torch.tensor(rejected, dtype=torch.int64)] = 0.0
    cdf = torch.cumsum(mass, 0)  # [V]
    hits = torch.nonzero((cdf > u * float(cdf[-1])) & (mass > 0))
    if hits.numel():
        return int(hits[0, 0])
    return int(torch.nonzero(mass > 0)[-1, 0])


__all__ = ["NO_NODE", "TorchTreeOps", "children", "greedy_path", "inverse_cdf", "repeated_siblings"]
