"""Token-tree verification in torch, one request's tree at a time: the rules of
``spec_backend.testing.tree_spec`` (its float64 law is the specification; the Monte-Carlo tests hold this op
to it).

Glossary: a *tree* is ``parents`` (node ``i``'s parent, ``-1`` the root = the last committed token; each
parent precedes its children) and ``tokens [n]``; ``target_probs [n + 1, V]`` holds the target's
distribution after the root (row 0) and after each node (row ``1 + i``); ``draft_probs [n, V]`` the
distribution node ``i`` was drawn from *given its earlier siblings* (``None``: every node a point mass,
as top-k and static trees draft them).

*Recursive rejection sampling*: from the root, the children of the current node are tried in order; child
``x`` is accepted when ``u < r(x) / q(x)`` (``r`` the current target distribution, ``q`` the child's), and
verification moves into it with ``r`` = the target's distribution there; on rejection ``r`` becomes
``norm(max(r - q, 0))``. When no child is accepted, or the node is a leaf, the final token is drawn from
``r``. Greedy requests follow the target's argmax instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeOutcome:
    """The accepted nodes, root to leaf, and the token emitted after them."""

    path: list[int]
    final_token: int

    def emitted(self, tokens: Sequence[int]) -> tuple[int, ...]:
        return (*(int(tokens[i]) for i in self.path), self.final_token)


def _children(parents: Sequence[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(
                f"tree parents {list(parents)}: node {i} must have a parent in -1..{i - 1}, got {p}"
            )
        kids.setdefault(p, []).append(i)
    return kids


def verify_tree_greedy(
    parents: Sequence[int], tokens: Sequence[int], target_argmax: Sequence[int]
) -> TreeOutcome:
    """The longest path whose tokens are the target's argmax (``target_argmax [n + 1]``, row as above)."""
    kids, node, path = _children(parents), -1, list[int]()
    while True:
        best = int(target_argmax[node + 1])
        match = [c for c in kids.get(node, []) if int(tokens[c]) == best]
        if not match:
            return TreeOutcome(path, best)
        node = match[0]
        path.append(node)


def verify_tree(
    parents: Sequence[int],
    tokens: Sequence[int],
    target_probs: torch.Tensor,  # [n + 1, V]
    draft_probs: torch.Tensor | None,  # [n, V] or None (point masses)
    uniforms: Sequence[float],  # [n] one acceptance uniform per node
    final_uniform: float,  # the final token's inverse-CDF uniform
) -> TreeOutcome:
    """Recursive rejection sampling over one tree (module docstring)."""
    kids, node, path = _children(parents), -1, list[int]()
    r = target_probs[0].double()  # [V]
    while True:
        accepted = None
        for child in kids.get(node, []):
            x = int(tokens[child])
            q = draft_probs[child].double() if draft_probs is not None else _point(x, r)  # [V]
            if float(q[x]) > 0 and uniforms[child] * float(q[x]) < float(r[x]):
                accepted = child
                break
            rest = torch.clamp(r - q, min=0.0)
            total = float(rest.sum())
            r = rest / total if total > 0 else r
        if accepted is None:
            return TreeOutcome(path, _inverse_cdf(r, final_uniform))
        node = accepted
        path.append(node)
        r = target_probs[node + 1].double()


def _point(token: int, like: torch.Tensor) -> torch.Tensor:
    point = torch.zeros_like(like)
    point[token] = 1.0
    return point


def _inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token whose cumulative probability first exceeds ``u`` of the total (never one of probability
    0)."""
    cdf = torch.cumsum(probs, 0)
    index = int(torch.searchsorted(cdf, torch.tensor(u * float(cdf[-1]), dtype=cdf.dtype), right=True))
    index = min(index, probs.numel() - 1)
    while float(probs[index]) <= 0:  # rounding at the top of the CDF
        index -= 1
    return index


__all__ = ["TreeOutcome", "verify_tree", "verify_tree_greedy"]
