"""EAGLE-2's dynamic tree for a batch, grown by a head that drafts one level per forward under tree
attention (``proposers.eagle``). The host reference is ``proposers.tree_build.dynamic_tree``; this is the
same rule batched, with cumulative log-probabilities in float64 in place of products (the same order).

Glossary: *grown nodes* — every node expanded so far, level by level: the root's ``top_k`` children, then
``top_k`` children of each of the ``top_k`` frontier nodes per level (``top_k²``), so every request has
the same count; *frontier* — the ``top_k`` nodes of the last level with the highest cumulative
probability; *fed* — the frontier and its ancestors, the head's query in the forward that gives the
frontier's outputs (each node fed with its parent's output, the root's for the first level).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

#: (per request the fed nodes' parent columns, tokens [B, Q], hidden [B, Q, H]) -> outputs [B, Q, H]
LevelForward = Callable[[Sequence[Sequence[int]], torch.Tensor, torch.Tensor], torch.Tensor]
LogProbs = Callable[[torch.Tensor], torch.Tensor]  # outputs [..., H] -> log-probabilities [..., V]


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Grower:
    """What a drafter grows a tree with (``Drafter.grower``): the root's output ``[B, H]`` (the last
    committed row's), a level's forward, the draft log-probabilities of outputs, and what to do once the
    tree is grown (``done``: e.g. drop its nodes from the drafter's cache)."""

    root: torch.Tensor  # [B, H]
    forward: LevelForward
    log_probs: LogProbs
    done: Callable[[], None] = _nothing


def grow_dynamic_tree(
    root: torch.Tensor,  # [B, H] the head's output for the last committed row
    forward: LevelForward,
    log_probs: LogProbs,
    depth: int,
    top_k: int,
    nodes: int,
) -> tuple[torch.Tensor, tuple[tuple[int, ...], ...]]:  # ids [B, nodes], parents per request
    """Grow ``depth`` levels and keep the ``nodes`` of highest cumulative draft probability (module
    docstring), renumbered in grown order so that parents precede children."""
    first = torch.topk(log_probs(root).double(), top_k, dim=-1)  # [B, k]
    tokens, scores = first.indices, first.values  # [B, G] grown so far
    parents = [[-1] * top_k for _ in range(root.shape[0])]  # host [B][G]
    outs = root.new_zeros((root.shape[0], top_k, root.shape[1]))  # [B, G, H] outputs of fed nodes
    frontier = torch.arange(top_k, device=root.device).expand(root.shape[0], -1)  # [B, k] grown index
    for _ in range(depth - 1):
        outs = feed_level(root, forward, tokens, outs, parents, frontier.tolist())
        picked = outs.gather(1, frontier[..., None].expand(-1, -1, outs.shape[-1]))  # [B, k, H]
        top = torch.topk(log_probs(picked).double(), top_k, dim=-1)  # [B, k, k]
        grown = scores.gather(1, frontier)[..., None] + top.values  # [B, k, k] cumulative
        base = tokens.shape[1]
        for b, row in enumerate(frontier.tolist()):
            parents[b] += [p for p in row for _ in range(top_k)]
        tokens = torch.cat([tokens, top.indices.flatten(1)], dim=1)
        scores = torch.cat([scores, grown.flatten(1)], dim=1)
        outs = torch.cat([outs, outs.new_zeros((outs.shape[0], top_k * top_k, outs.shape[2]))], dim=1)
        order = torch.sort(-grown.flatten(1), dim=1, stable=True).indices  # [B, k²] best first
        frontier = base + order[:, :top_k]
    return _keep(tokens, scores, parents, nodes)


def feed_level(
    root: torch.Tensor,  # [B, H]
    forward: LevelForward,
    tokens: torch.Tensor,  # [B, G]
    outs: torch.Tensor,  # [B, G, H]
    parents: list[list[int]],
    frontier: list[list[int]],
) -> torch.Tensor:  # [B, G, H] with the fed nodes' outputs written
    """One forward over each request's frontier and its ancestors."""
    fed: list[list[int]] = []  # per request, grown indices in grown order
    for b, row in enumerate(frontier):
        seen: set[int] = set()
        for node in row:
            while node >= 0 and node not in seen:
                seen.add(node)
                node = parents[b][node]
        fed.append(sorted(seen))
    width = max(len(f) for f in fed)
    index = torch.tensor([f + [f[-1]] * (width - len(f)) for f in fed], device=tokens.device)  # [B, Q]
    above = torch.tensor([[parents[b][n] for n in f] + [-1] * (width - len(f)) for b, f in enumerate(fed)])
    above = above.to(tokens.device)  # [B, Q] grown index of each fed node's parent (-1: the root)
    hidden = torch.where(
        (above >= 0)[..., None],
        outs.gather(1, above.clamp_min(0)[..., None].expand(-1, -1, outs.shape[-1])),
        root[:, None, :],
    )  # [B, Q, H]
    columns = [[f.index(parents[b][n]) if parents[b][n] >= 0 else -1 for n in f] for b, f in enumerate(fed)]
    out = forward(columns, tokens.gather(1, index), hidden)  # [B, Q, H]
    outs = outs.clone()
    for b, f in enumerate(fed):
        outs[b, f] = out[b, : len(f)]
    return outs


def _keep(
    tokens: torch.Tensor,  # [B, G]
    scores: torch.Tensor,  # [B, G] float64 cumulative log-probabilities
    parents: list[list[int]],
    nodes: int,
) -> tuple[torch.Tensor, tuple[tuple[int, ...], ...]]:
    """The ``nodes`` best grown nodes, in grown order: a child never scores above its parent and ties go
    to the earlier node, so every kept node's ancestors are kept."""
    best = torch.sort(-scores, dim=1, stable=True).indices[:, :nodes]  # [B, nodes]
    kept = torch.sort(best, dim=1).values  # [B, nodes] grown order
    out: list[tuple[int, ...]] = []
    for b, row in enumerate(kept.tolist()):
        renumber = {old: new for new, old in enumerate(row)}
        out.append(tuple(renumber[parents[b][n]] if parents[b][n] >= 0 else -1 for n in row))
    return tokens.gather(1, kept), tuple(out)


__all__ = ["Grower", "LevelForward", "LogProbs", "feed_level", "grow_dynamic_tree"]
