"""Token-tree decode steps (#42): a static tree (``speculative_token_tree``), an EAGLE-2 dynamic one
(``tree_top_k``/``tree_nodes``) or the trie of i.i.d. draft paths (``tree_paths``) drafted, verified and
compacted, then shown to the rest of the step as the chain of its accepted path.

Glossary: *plan* — a static tree's shape in breadth-first order (``parents``, ``ranks``; see
``proposers.tree_build``); a dynamic tree's shape is the drafter's, per request and step
(``DraftOutput.tree_parents``), also level by level. A request with budget ``b`` verifies the nodes of
depth ``<= b`` (a prefix of the order, so a subtree). *Chain view* — after verification, the step's
batch and target rows restricted to the request's first token and its accepted nodes, as if a chain step
had fed exactly those: the drafter, the metrics and logprobs read it unchanged, and the cache holds
exactly those positions (``keep_path``).

Verification (``TREE_RULE``: ``SamplerOps.tree_verify`` over the whole batch): greedy requests follow
the target's argmax path; sampled ones run recursive rejection sampling with every node a point mass (the
drafted children of a node are its draft distribution's top tokens), lossless for any temperature, top-k
and top-p. Uniforms are counter-based: stream ``rng.STREAM_TREE``, the request's seed, the position of
its first node and the node's index (the final token: the request's node count). Penalties, bad words,
logit bias, ``min_tokens`` and ``min_p`` act on each row with its node's path as history; requests with
structured outputs are refused with a tree (a grammar's state would have to branch with it). I.i.d.
draft paths are verified by ``GBV_RULE`` (greedy multi-path block verification, ``sampling.gbv_ops``):
only a prefix of one selected path is accepted, lossless for any temperature, top-k and top-p.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from spec_backend.config.token_tree import TokenTree, branching_tree
from spec_backend.engine.logits import RowHistory, process_logits
from spec_backend.proposers.draft_paths import grow_paths
from spec_backend.proposers.tree_build import depths_of, static_shape
from spec_backend.sampling import rng
from spec_backend.sampling.tree_ops import NO_NODE
from spec_backend.sampling.tree_verify import TreeOutcome
from spec_backend.step import StepBatch, TargetOutput, build_step_batch, build_tree_step_batch
from spec_backend.verify_rules import tree_rule

if TYPE_CHECKING:
    from spec_backend.config import SpeculativeConfig
    from spec_backend.engine.request import Request
    from spec_backend.proposers.contract import Drafter, DraftInputs, DraftOutput
    from spec_backend.sampling.ops import SamplerOps
    from spec_backend.sampling.sampling_metadata import SamplingMetadata

#: methods whose drafters draft token trees, and which kinds: ``static`` (``Drafter.propose_tree``),
#: ``dynamic`` (EAGLE-2, ``Drafter.propose_dynamic_tree``), ``paths`` (i.i.d. paths for GBV,
#: ``proposers.draft_paths.grow_paths`` over ``Drafter.grower``)
TREE_METHODS: dict[str, tuple[str, ...]] = {
    "dflash": ("static", "dynamic", "paths"),
    "draft_model": ("static", "dynamic", "paths"),
    "dspark": ("static", "dynamic", "paths"),
    "eagle": ("static", "dynamic", "paths"),
    "eagle3": ("static", "dynamic", "paths"),
    "medusa": ("static",),
    "mtp": ("static", "dynamic", "paths"),
    "ngram": ("static",),
}


def nodes_within(parents: Sequence[int], budget: int) -> int:
    """A tree's nodes of depth ``<= budget`` (a prefix: parents precede children, level by level)."""
    return sum(d <= budget for d in depths_of(parents))


@dataclass(frozen=True)
class TreePlan:
    """A static tree's shape in breadth-first order (module docstring)."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    @classmethod
    def of(cls, tree: TokenTree) -> TreePlan:
        return cls(*static_shape(tree))

    describe = "a branching speculative_token_tree"
    paths = 0  # verified as a tree of siblings, not as i.i.d. paths (``DraftPaths``)

    @property
    def max_nodes(self) -> int:
        return len(self.parents)

    def draft(self, drafter: Drafter, inputs: DraftInputs) -> DraftOutput:
        out = drafter.propose_tree(inputs, self.parents, self.ranks)  # a drafter may keep a subtree
        if out.tree_parents is not None:
            return out
        return replace(out, tree_parents=(self.parents,) * len(inputs.requests))


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's tree, grown afresh each step (``config.token_tree``): ``depth`` levels, ``top_k``
    expansions, ``nodes`` kept."""

    depth: int
    top_k: int
    nodes: int

    describe = "a dynamic token tree (tree_top_k/tree_nodes)"
    paths = 0  # verified as a tree of siblings, not as i.i.d. paths (``DraftPaths``)

    @property
    def max_nodes(self) -> int:
        return self.nodes

    def draft(self, drafter: Drafter, inputs: DraftInputs) -> DraftOutput:
        out = drafter.propose_dynamic_tree(inputs, self.depth, self.top_k, self.nodes)
        if out.tree_parents is None or len(out.tree_parents) != len(inputs.requests):
            raise RuntimeError(
                f"{type(drafter).__name__}.propose_dynamic_tree returned no parents per request"
            )
        return out


@dataclass(frozen=True)
class DraftPaths:
    """``paths`` i.i.d. draft paths of ``depth`` tokens merged into a trie (``tree_paths``), verified by
    greedy multi-path block verification (``GBV_RULE``)."""

    depth: int
    paths: int

    describe = "i.i.d. draft paths (tree_paths)"

    @property
    def max_nodes(self) -> int:
        return self.depth * self.paths

    def draft(self, drafter: Drafter, inputs: DraftInputs) -> DraftOutput:
        with torch.inference_mode():
            return grow_paths(drafter.grower(inputs), self.depth, self.paths, inputs.requests)


Plan = TreePlan | DynamicTree | DraftPaths


def tree_plan(config: SpeculativeConfig) -> Plan | None:
    """The tree ``config`` asks for: a ``speculative_token_tree`` that branches, a dynamic one, or i.i.d.
    paths; ``None`` for a chain (the chain step)."""
    if config.tree_paths is not None:
        assert config.num_speculative_tokens is not None
        return DraftPaths(config.num_speculative_tokens, config.tree_paths)
    if config.tree_top_k is not None and config.tree_nodes is not None:
        assert config.num_speculative_tokens is not None
        return DynamicTree(config.num_speculative_tokens, config.tree_top_k, config.tree_nodes)
    branching = branching_tree(config.token_tree)
    return TreePlan.of(branching) if branching is not None else None


@dataclass(frozen=True)
class TreeResult:
    """A verified tree step in its chain view (module docstring)."""

    batch: StepBatch
    target: TargetOutput
    emitted: list[list[int]]
    drafted: list[int]


def refuse_grammars(requests: Sequence[Request]) -> None:
    """``ValueError`` for a request with structured outputs: not supported with a token tree yet."""
    for r in requests:
        if not r.finished and r.grammar is not None:
            raise ValueError(
                f"request {r.request_id!r}: structured outputs are not supported with a token tree yet"
            )


def _processed(
    logits: torch.Tensor,  # [N, V] every row of the tree step
    requests: Sequence[Request],
    fed: list[list[int]],  # per request the parents of the nodes fed
    nodes: list[list[int]],  # per request the tokens of its real nodes
) -> torch.Tensor:  # [N, V]
    """The logits verification reads: penalties, bad words, logit bias, ``min_tokens`` and ``min_p``
    applied to each row with its own history — the tokens of its node's path (``RowHistory``)."""
    if not any(r.params.processes_logits for r in requests):
        return logits
    owner: list[int] = []
    prior: list[list[int]] = []
    for b, parents in enumerate(fed):
        paths: list[list[int]] = []
        for i, parent in enumerate(parents):  # padding nodes (past the real ones) have no history
            token = [nodes[b][i]] if i < len(nodes[b]) else []
            paths.append([*(paths[parent] if parent >= 0 else []), *token])
        owner += [b] * (1 + len(parents))
        prior += [[], *paths]
    return process_logits(
        logits,
        [r.params for r in requests],
        [r.prompt_token_ids for r in requests],
        [r.output_token_ids for r in requests],
        [r.min_tokens_stop_ids for r in requests],
        RowHistory(owner, prior),
    )


#: the rules the engine verifies trees with: its nodes are point masses (top tokens), or, for the sampled
#: requests of a probabilistic drafter's static tree, drawn siblings (``proposers.sibling_draws``)
TREE_RULE, SAMPLED_TREE_RULE = tree_rule("point_mass"), tree_rule("rrs")
#: the rule of i.i.d. draft paths (``DraftPaths``)
GBV_RULE = tree_rule("gbv")


def _outcomes(
    parents: Sequence[Sequence[int]],  # per request its nodes' parents
    counts: list[int],
    query: torch.Tensor,  # [B, 1 + K_max] the last token, then each request's nodes
    logits: torch.Tensor,  # [N, V] every row of the tree step
    loc: list[int],  # [B + 1] where each request's rows start (padding nodes of a captured step included)
    sampling: SamplingMetadata,
    ops: SamplerOps,
    draft_probs: torch.Tensor | None,  # [B, >= M, V] each node's sibling distribution, or None
    paths: int = 0,
) -> list[TreeOutcome]:
    """Each request's verified path and final token, by ``TREE_RULE``'s kernel for the whole batch
    (``SAMPLED_TREE_RULE``'s with ``draft_probs``; ``GBV_RULE``'s for ``paths`` i.i.d. draft paths)."""
    batch, width = len(counts), max(max(counts, default=0), 1)
    layout = torch.full((batch, width), NO_NODE, dtype=torch.int64)
    for b, n in enumerate(counts):
        layout[b, :n] = torch.tensor(list(parents[b][:n]), dtype=torch.int64)
    device = logits.device
    tokens = query.new_zeros((batch, width))  # [B, M] (placeholders past a count are never read)
    tokens[:, : query.shape[1] - 1] = query[:, 1 : 1 + width].clamp_min(0)  # a step without drafts: none
    lens = torch.tensor([b - a for a, b in itertools.pairwise(loc)], device=device)  # [B] rows per request
    probs = logits  # [N, V] stands in for the probabilities, read only for sampled requests
    if not sampling.all_greedy:
        temperature, top_k, top_p = (
            torch.repeat_interleave(t, lens) for t in (sampling.temperature, sampling.top_k, sampling.top_p)
        )  # each [N]
        probs = ops.target_probs(
            logits, temperature, top_k, top_p, sampling.apply_top_k, sampling.apply_top_p, sampling.max_top_k
        )  # [N, V]
    argmax = None if sampling.all_random else ops.argmax(logits)  # [N]
    uniforms = torch.zeros((batch, width + 1), dtype=torch.float64, device=device)
    if not sampling.all_greedy:
        assert sampling.seeds is not None and sampling.positions is not None
        counters = torch.arange(width + 1, device=device).expand(batch, -1).clone()  # [B, M + 1]
        counters[:, width] = torch.tensor(counts, device=device)  # the final token's counter: n_b
        uniforms = ops.uniforms(
            sampling.seeds[:, None].expand(-1, width + 1).flatten(),
            sampling.positions[:, None].expand(-1, width + 1).flatten(), counters.flatten(), rng.STREAM_TREE,
        ).view(batch, width + 1)  # fmt: skip
    starts = torch.tensor(loc[:-1], dtype=torch.int64, device=device)  # [B]
    if draft_probs is not None:  # at least one column per counted node (``pending.take``)
        assert draft_probs.shape[1] >= width, f"{draft_probs.shape[1]} draft columns for {width} nodes"
        draft_probs = draft_probs[:, :width]  # [B, M, V]
    rule = GBV_RULE if paths else TREE_RULE if draft_probs is None else SAMPLED_TREE_RULE
    assert rule.kernel is not None
    path, final = rule.kernel(ops, max(paths, 1))(
        layout.to(device), tokens, probs, argmax, starts, sampling.temperature <= 0, uniforms, draft_probs
    )
    return [
        TreeOutcome([i for i in row if i >= 0], last)
        for row, last in zip(path.tolist(), final.tolist(), strict=True)
    ]


def verify_trees(
    requests: Sequence[Request],
    parents: Sequence[Sequence[int]],  # per request its tree's node parents (at least ``counts[b]``)
    start: int,
    query: torch.Tensor,  # [B, 1 + K_max] the last token, then each request's nodes (placeholders past)
    counts: list[int],
    cached: list[int],
    forward: Callable[[StepBatch, bool], TargetOutput],
    sampling: SamplingMetadata,
    keep_path: Callable[[int, int, Sequence[int]], None],
    ops: SamplerOps,
    width: int | None = None,
    draft_probs: torch.Tensor | None = None,  # [B, K_max, V] sampled siblings' distributions
    paths: int = 0,  # i.i.d. draft paths (``DraftPaths``): verified by GBV
) -> TreeResult:
    """Run the tree step: forward over every node, verify, keep each accepted path in the cache
    (``keep_path(slot, first, columns)``), and return the chain view (module docstring). ``width``: feed
    that many nodes per request (a captured step's shape), padding nodes hanging off the root."""
    fed = [[*parents[b][:n], *[-1] * ((width or n) - n)] for b, n in enumerate(counts)]
    batch = build_tree_step_batch(start, query, fed, cached)
    target = forward(batch, False)
    host = query.tolist()
    nodes = [host[b][1 : 1 + n] for b, n in enumerate(counts)]
    loc = batch.query_start_loc_host
    verified = _processed(target.logits, requests, fed, nodes)  # [N, V]
    outcomes = _outcomes(parents, counts, query, verified, loc, sampling, ops, draft_probs, paths)
    for b, outcome in enumerate(outcomes):
        keep_path(start + b, cached[b], [0, *(1 + i for i in outcome.path)])
    accepted = [[host[b][0], *(nodes[b][i] for i in o.path)] for b, o in enumerate(outcomes)]
    width = max(len(p) for p in accepted)
    chain = torch.zeros((len(accepted), width), dtype=torch.int64)
    for b, path in enumerate(accepted):
        chain[b, : len(path)] = torch.tensor(path)
    lens = [len(p) for p in accepted]
    view = build_step_batch(start, chain.to(query.device), lens, cached, [n - 1 for n in lens])
    rows = torch.tensor([loc[b] + c for b, o in enumerate(outcomes) for c in (0, *(1 + i for i in o.path))])
    rows = rows.to(target.logits.device)
    chained = TargetOutput(
        logits=target.logits[rows],
        final=target.final[rows] if target.final is not None else None,
        aux=target.aux[rows] if target.aux is not None else None,
    )
    emitted = [[nodes[b][i] for i in o.path] + [o.final_token] for b, o in enumerate(outcomes)]
    return TreeResult(view, chained, emitted, list(counts))


__all__ = [
    "GBV_RULE",
    "TREE_METHODS",
    "DraftPaths",
    "DynamicTree",
    "Plan",
    "TreePlan",
    "TreeResult",
    "nodes_within",
    "refuse_grammars",
    "tree_plan",
    "verify_trees",
]
