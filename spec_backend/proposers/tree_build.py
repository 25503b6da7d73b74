"""Building draft token trees (#42): static trees from ``speculative_token_tree`` and EAGLE-2 dynamic
trees, over any drafter that can give the draft distribution after a node.

Glossary:

* *tree* — ``parents`` (node ``i``'s parent; ``-1`` the root, the last committed token; parents precede
  children) and ``tokens``; the layout ``sampling.tree_verify`` and ``step.build_tree_step_batch`` read;
* *static tree* — vLLM's ``speculative_token_tree``: each node a tuple of child ranks from the root
  (``(1, 0)``: the most likely child of the root's second most likely child); node ``(..., r)`` gets the
  ``r``-th most likely token of its parent's draft distribution, so siblings are distinct point masses
  (verified losslessly by the point-mass rule);
* *EAGLE-2 dynamic tree* — grown ``depth`` levels: at each level the ``top_k`` frontier nodes of highest
  *cumulative* draft probability (product along the path) each get their ``top_k`` most likely children;
  then every grown node is reranked by cumulative probability and the best ``budget`` kept. A child's
  cumulative probability never exceeds its parent's and ties go to the shallower, earlier node, so the
  kept set always contains each kept node's ancestors.

``dist_at(parent, path)`` is the drafter's distribution ``[V]`` after ``path`` (the tokens from the root's
child down to ``parent``; empty for the root).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from spec_backend.config.token_tree import TokenTree

if TYPE_CHECKING:
    from spec_backend.proposers.sibling_draws import SampledSiblings

DistAt = Callable[[int, tuple[int, ...]], torch.Tensor]  # (parent node, path) -> probabilities [V]


@dataclass(frozen=True)
class DraftTree:
    """A drafted tree (module docstring)."""

    parents: tuple[int, ...]
    tokens: tuple[int, ...]

    def path(self, node: int) -> tuple[int, ...]:
        out: list[int] = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return tuple(reversed(out))

    @property
    def depths(self) -> list[int]:
        return depths_of(self.parents)


def static_shape(tree: TokenTree) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(parents, ranks)`` of a ``speculative_token_tree`` in its breadth-first order."""
    nodes = sorted(tree, key=lambda t: (len(t), t))
    index = {node: i for i, node in enumerate(nodes)}
    return tuple(index[n[:-1]] if len(n) > 1 else -1 for n in nodes), tuple(n[-1] for n in nodes)


def fill_static(parents: Sequence[int], ranks: Sequence[int], dist_at: DistAt) -> DraftTree:
    """The tokens of a static tree: node ``i`` is the ``ranks[i]``-th most likely token after its parent."""
    tokens: list[int] = []
    order: dict[int, list[int]] = {}  # parent -> its distribution's tokens, most likely first
    for parent, rank in zip(parents, ranks, strict=True):
        if parent not in order:
            path = DraftTree(tuple(parents[: len(tokens)]), tuple(tokens)).path(parent)
            order[parent] = torch.argsort(dist_at(parent, path), descending=True, stable=True).tolist()
        tokens.append(int(order[parent][rank]))
    return DraftTree(tuple(parents), tuple(tokens))


def dynamic_tree(dist_at: DistAt, depth: int, top_k: int, budget: int) -> DraftTree:
    """EAGLE-2's tree (module docstring): ``depth`` levels of ``top_k`` expansions, ``budget`` nodes kept."""
    if min(depth, top_k, budget) < 1:
        raise ValueError(f"depth, top_k and budget must be >= 1, got {depth}, {top_k}, {budget}")
    parents: list[int] = []
    tokens: list[int] = []
    score: list[float] = []  # cumulative draft probability of each grown node
    frontier = [-1]
    for _ in range(depth):
        grown: list[int] = []
        for parent in frontier:
            probs = dist_at(parent, DraftTree(tuple(parents), tuple(tokens)).path(parent)).double()
            top = torch.topk(probs, min(top_k, probs.numel()))
            base = score[parent] if parent >= 0 else 1.0
            for p, t in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                parents.append(parent)
                tokens.append(int(t))
                score.append(base * p)
                grown.append(len(tokens) - 1)
        frontier = sorted(grown, key=lambda n: (-score[n], n))[:top_k]
    kept = sorted(sorted(range(len(tokens)), key=lambda n: (-score[n], n))[:budget])  # grown order
    renumber = {old: new for new, old in enumerate(kept)}
    return DraftTree(
        tuple(renumber[parents[n]] if parents[n] >= 0 else -1 for n in kept), tuple(tokens[n] for n in kept)
    )


def depths_of(parents: Sequence[int]) -> list[int]:
    """Each node's depth (the root's children: 1)."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


def fill_static_batch(
    parents: Sequence[int],
    ranks: Sequence[int],
    logits_at: Callable[[int, Sequence[torch.Tensor]], torch.Tensor],  # (parent, columns) -> [B, V]
    siblings: SampledSiblings | None = None,
) -> torch.Tensor:  # [B, n] int64
    """``fill_static`` for a batch: node ``i`` of every request is the ``ranks[i]``-th most likely token
    of ``logits_at(parents[i], columns)`` (with ``siblings``: its ``ranks[i]``-th draw, for the requests
    that sample), asked once per parent; ``columns`` are the tokens ``[B]`` of the nodes filled so far
    (every node of the parent's depth, by the breadth-first order)."""
    columns: list[torch.Tensor] = []
    best: dict[int, torch.Tensor] = {}  # parent -> its children's tokens by rank [B, k]
    for parent, rank in zip(parents, ranks, strict=True):
        if parent not in best:
            need = 1 + max(r for p, r in zip(parents, ranks, strict=True) if p == parent)
            logits = logits_at(parent, columns)  # [B, V]
            best[parent] = (
                siblings.children(parent, logits, need)
                if siblings is not None
                else torch.topk(logits, need, dim=-1).indices
            )  # [B, need]
        columns.append(best[parent][:, rank])
    return torch.stack(columns, dim=1)


__all__ = [
    "DistAt",
    "DraftTree",
    "depths_of",
    "dynamic_tree",
    "fill_static",
    "fill_static_batch",
    "static_shape",
]
