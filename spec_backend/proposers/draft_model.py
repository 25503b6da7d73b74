"""``draft_model``: a separate small causal LM with the target's vocabulary drafts K tokens per step.

Per request, after the target accepted ``a`` drafts of the previous step:

1. roll the draft cache back to the committed prefix: the positions fed before drafting plus the
   ``min(a, fed drafts)`` accepted drafts (entries past it are forgotten in O(1));
2. catch up: feed the committed tokens the draft cache lacks (the new bonus/recovered token, a whole
   prompt after prefill) in one ragged forward, whose last row gives draft 1;
3. feed each draft back for drafts 2..K (one token per request per forward).

**Parallel drafting (PARD)**, ``parallel_drafting=True`` with a draft model trained for it (its
``config.json`` names the mask token as ``pard_token`` or ``ptd_token_id``): step 2 appends K-1 mask
tokens to each request's catch-up tokens in the same causal forward; the last catch-up row gives draft 1
and mask row d gives draft d+1, so K drafts cost one forward. The mask rows leave the draft cache at the
next step's roll-back (they are never committed).

**Token trees** (#42; ``speculative_token_tree`` or ``tree_top_k``/``tree_nodes``): after the catch-up,
the tree is drafted level by level, each level's forward feeding the nodes above it under tree attention
(``step.build_tree_batch``), so every node's children come from the distribution the chain through its
path would give; the nodes leave the draft cache afterwards and the next catch-up feeds the accepted
path.

The draft cache lives in the engine's slot table (moves and frees follow the target's), with K positions
of headroom (a tree's: the most nodes a level feeds): a request may draft past the last position it can
emit. Drafts are the argmax, or sampled with their probabilities under probabilistic verification
(``draft_sampling``; a static tree's siblings: ``sibling_draws``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from spec_backend.config.token_tree import branching_tree
from spec_backend.proposers.contract import (
    Drafter,
    DraftInputs,
    DraftOutput,
    DraftRequest,
    empty_drafts,
    pack_drafts,
)
from spec_backend.proposers.draft_model_ahead import DraftAhead
from spec_backend.proposers.draft_model_checks import check_positions, check_vocab, pard_token
from spec_backend.proposers.draft_sampling import DraftChain
from spec_backend.proposers.dynamic_tree import Grower
from spec_backend.proposers.sibling_draws import sampled_siblings, static_tree_output
from spec_backend.proposers.tree_build import depths_of, fill_static_batch
from spec_backend.step import SlotCache, build_step_batch, build_tree_batch

if TYPE_CHECKING:
    from spec_backend.backends.base import Backend
    from spec_backend.proposers.contract import DrafterContext, FlightTokens
    from spec_backend.runtime.captured import CapturedChain, CapturedDecode
    from spec_backend.runtime.kv_cache import RaggedKVCache
    from spec_backend.runtime.runner import ModelRunner


@dataclass
class _Fed:
    """What a request's draft cache holds beyond its committed prefix: drafts fed from ``start``
    (``None``: a new request, whose cache holds what a prefix-cache hit loaded, if anything)."""

    start: int | None = None
    drafts: int = 0


class DraftModelDrafter(Drafter):
    """See the module docstring. ``probabilistic``: sample drafts and return their probabilities."""

    def __init__(
        self,
        model: Any,
        k: int,
        max_model_len: int,
        probabilistic: bool,
        backend: Backend | None = None,
        enforce_eager: bool = True,
        mask_token_id: int | None = None,
    ) -> None:
        from spec_backend.runtime.kv_cache import kv_layout

        self.model = model
        self.num_speculative_tokens = k
        self.max_model_len = max_model_len
        self.probabilistic = probabilistic
        self.layout = kv_layout(model.config, model.dtype, next(model.parameters()).device)
        self.runner: ModelRunner | None = None
        self.backend, self.enforce_eager = backend, enforce_eager
        self.decode_graph: CapturedDecode | None = None  # drafts 2..K: one token per request
        self.chain_graph: CapturedChain | None = None  # drafts 2..K in one replay (argmax drafts)
        self.headroom = k  # cache positions past max_model_len a step may write (a tree level: its nodes)
        self._fed: dict[str, _Fed] = {}
        self.mask_token_id = mask_token_id  # PARD parallel drafting when set
        self.drafts_trees = False  # set by the builder for token trees: no chain step to capture
        self.ahead: DraftAhead | None = None  # greedy chains over device lengths: drafting ahead

    def cache_bytes_per_slot(self) -> int:
        return self.layout.bytes_per_position * (self.max_model_len + self.headroom)

    def allocate_caches(self, num_slots: int) -> None:
        from spec_backend.runtime.captured import capture_chain, maybe_capture
        from spec_backend.runtime.kv_cache import RaggedKVCache
        from spec_backend.runtime.runner import ModelRunner

        cache = RaggedKVCache(self.layout, self.max_model_len, num_slots, headroom=self.headroom)
        self.runner = ModelRunner(self.model, cache)
        if self.num_speculative_tokens > 1:
            self.decode_graph = maybe_capture(self.runner, self.backend, 1, num_slots, self.enforce_eager)
        self.chain_graph = None
        chains = not (self.probabilistic or self.drafts_trees or self.mask_token_id is not None)
        if self.decode_graph is not None and self.backend is not None and chains:  # argmax chains only
            self.chain_graph = capture_chain(self.decode_graph, self.backend, self.num_speculative_tokens - 1)
        self.ahead = None
        if self.chain_graph is not None:  # captured where attention reads device lengths: ahead too
            pair = maybe_capture(self.runner, self.backend, 2, num_slots, self.enforce_eager)
            if pair is not None:
                pair.device_lengths = True
                self.ahead = DraftAhead(pair, self.chain_graph)
        self.drafts_ahead = self.ahead is not None

    def caches(self) -> Sequence[SlotCache]:
        return (self._runner().cache,)

    def prefix_caches(self) -> Sequence[RaggedKVCache]:
        """The draft cache: a function of the tokens alone, so prompt blocks of it are reusable."""
        return (self._runner().cache,)

    def _runner(self) -> ModelRunner:
        if self.runner is None:
            raise RuntimeError("the draft model's cache was not allocated (allocate_caches)")
        return self.runner

    def add_request(self, request: DraftRequest) -> None:
        self._fed[request.request_id] = _Fed()

    def remove_request(self, request_id: str) -> None:
        self._fed.pop(request_id, None)

    def propose_ahead(
        self, requests: Sequence[DraftRequest], flight: FlightTokens, budgets: Sequence[int]
    ) -> torch.Tensor:  # [B, K]
        """K greedy drafts per request after ``flight`` (``draft_model_ahead``; budgets are K there)."""
        if self.ahead is None:
            raise NotImplementedError("this draft model drafts ahead only as a captured greedy chain")
        return self.ahead.propose(flight)

    def ready_ahead(self, requests: Sequence[DraftRequest]) -> bool:
        """Each request's cache holds its tokens and K-1 fed drafts (``DraftAhead`` feeds from there): a
        draft-next drafted K for it at its current tokens (not one with speculation off, review)."""
        fed, k = self._fed, self.num_speculative_tokens
        return self.ahead is not None and all(
            (f := fed.get(r.request_id)) is not None and f.start == r.num_tokens and f.drafts == k - 1
            for r in requests
        )

    def landed_ahead(self, requests: Sequence[DraftRequest | None]) -> None:
        """Each live request's cache holds its tokens and K-1 fed drafts, as after a draft-next."""
        cache, fed = self._runner().cache, self.num_speculative_tokens - 1
        for slot, request in enumerate(requests):
            if request is not None:
                cache.truncate(slot, request.num_tokens + fed)
                self._fed[request.request_id] = _Fed(start=request.num_tokens, drafts=fed)

    def propose(self, inputs: DraftInputs) -> DraftOutput:
        runner, requests = self._runner(), inputs.requests
        start, batch = inputs.batch.start, len(requests)
        device = self.layout.device
        k_max = max(inputs.budgets, default=0)
        feeds = self._roll_back(inputs, start)
        if k_max == 0:
            return empty_drafts(batch, self.num_speculative_tokens, device)
        chain = DraftChain(requests, self.probabilistic, device)
        if self.mask_token_id is not None:
            return self._propose_parallel(inputs, feeds, k_max, chain)
        logits = self._catch_up(start, feeds)  # [B, V] draft 1's
        for step in range(k_max):
            ids = chain.draw(logits)  # [B]
            if step == 0 and self.chain_graph is not None and self.chain_graph.chains(start, batch, k_max):
                chain.extend(self.chain_graph.forward(ids))  # drafts 2..K: one replay
                break
            if step + 1 < k_max:  # feed this draft for the next one
                cached = runner.cache.lengths[start : start + batch]
                step_batch = build_step_batch(start, ids[:, None], [1] * batch, cached)
                graph = self.decode_graph if start == 0 else None  # eager above its largest size
                graph = graph if graph is not None and graph.padded_tokens(batch) is not None else None
                # [B, V]: a one-token step's rows are its last rows
                out = graph.forward(step_batch) if graph else runner.forward(step_batch, True)
                logits = out.logits
        for request in requests:
            self._fed[request.request_id] = _Fed(start=request.num_tokens, drafts=k_max - 1)
        return chain.output(inputs.budgets)

    @torch.inference_mode()
    def propose_tree(self, inputs: DraftInputs, parents: Sequence[int], ranks: Sequence[int]) -> DraftOutput:
        """A static tree, level by level: a node's children are ranked by the draft model's logits after
        its path. A level's forward feeds every node above it under tree attention
        (``step.build_tree_batch``: a node sees the committed tokens and its ancestors, at position
        ``committed + depth - 1``), so each node's distribution is the one the chain through its path
        gives."""
        start, batch = inputs.batch.start, len(inputs.requests)
        outs = {-1: self._tree_root(inputs)}  # node -> the draft logits after it [B, V]; -1: the root
        base = list(self._runner().cache.lengths[start : start + batch])  # the committed tokens
        depths = depths_of(parents)

        def logits_at(parent: int, columns: Sequence[torch.Tensor]) -> torch.Tensor:  # -> [B, V]
            if parent not in outs:  # feed every node of depth <= the parent's (all filled, breadth first)
                fed = sum(d <= depths[parent] for d in depths)
                ids = torch.stack(list(columns[:fed]), dim=1)  # [B, fed]
                logits = self._tree_forward(start, ids, [parents[:fed]] * batch, base)  # [B, fed, V]
                outs.update({i: logits[:, i] for i in range(fed)})
            return outs[parent]

        siblings = sampled_siblings(inputs.requests, self.probabilistic)
        tokens = fill_static_batch(parents, ranks, logits_at, siblings)  # [B, n]
        self._forget_tree(inputs, base)
        return static_tree_output(tokens, parents, ranks, siblings)

    @torch.inference_mode()
    def grower(self, inputs: DraftInputs) -> Grower:
        """EAGLE-2's trees and multi-path drafts over the draft model's distributions (``dynamic_tree``,
        ``draft_paths``), each level's nodes fed as ``propose_tree`` feeds a static tree's levels. A node's
        output is its draft logits (``[B, grown, V]`` float32 held for the step); once grown, the nodes
        leave the draft cache."""
        start, batch = inputs.batch.start, len(inputs.requests)
        root = self._tree_root(inputs)  # [B, V]
        base = list(self._runner().cache.lengths[start : start + batch])

        def forward(columns: Sequence[Sequence[int]], ids: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
            return self._tree_forward(start, ids, columns, base)  # [B, Q, V]

        def log_probs(logits: torch.Tensor) -> torch.Tensor:  # [..., V]
            return torch.log_softmax(logits, dim=-1)

        return Grower(root, forward, log_probs, lambda: self._forget_tree(inputs, base))

    def _tree_root(self, inputs: DraftInputs) -> torch.Tensor:  # [B, V]
        """Roll back and catch up; the draft logits after the last committed token."""
        if self.mask_token_id is not None:
            raise RuntimeError("a PARD draft model drafts chains in one forward, not token trees")
        return self._catch_up(inputs.batch.start, self._roll_back(inputs, inputs.batch.start))

    def _tree_forward(
        self,
        start: int,
        tokens: torch.Tensor,  # [B, Q] the nodes fed, parents first (padded past each request's)
        parents: Sequence[Sequence[int]],  # per request each fed node's parent column (-1: a root child)
        base: Sequence[int],  # [B] the committed tokens' cache rows
    ) -> torch.Tensor:  # [B, Q, V] each fed node's draft logits
        cache = self._runner().cache
        for b, rows in enumerate(base):  # drop the previous level's nodes
            cache.truncate(start + b, rows)
        batch = build_tree_batch(start, tokens, parents, base)
        return batch.padded(self._runner().forward(batch, False).logits)

    def _forget_tree(self, inputs: DraftInputs, base: Sequence[int]) -> None:
        """The tree's nodes leave the draft cache: the next step catches up the accepted path."""
        cache, start = self._runner().cache, inputs.batch.start
        for b, request in enumerate(inputs.requests):
            cache.truncate(start + b, base[b])
            self._fed[request.request_id] = _Fed(start=request.num_tokens, drafts=0)

    def _catch_up(self, start: int, feeds: list[list[int]]) -> torch.Tensor:  # [B, V]
        """Feed each request the committed tokens its draft cache lacks; the last row's logits."""
        runner = self._runner()
        tokens = pack_drafts(feeds, max(len(f) for f in feeds), self.layout.device)  # [B, F]
        cached = runner.cache.lengths[start : start + len(feeds)]
        return runner.forward(build_step_batch(start, tokens, [len(f) for f in feeds], cached), True).logits

    def _propose_parallel(
        self, inputs: DraftInputs, feeds: list[list[int]], k_max: int, chain: DraftChain
    ) -> DraftOutput:
        """PARD: catch-up tokens then ``k_max - 1`` mask tokens per request, one forward, ``k_max`` drafts."""
        assert self.mask_token_id is not None
        runner, start, batch = self._runner(), inputs.batch.start, len(inputs.requests)
        rows = [f + [self.mask_token_id] * (k_max - 1) for f in feeds]
        tokens = pack_drafts(rows, max(len(r) for r in rows), self.layout.device)  # [B, F + K - 1]
        cached = runner.cache.lengths[start : start + batch]
        step_batch = build_step_batch(start, tokens, [len(r) for r in rows], cached)
        logits = runner.forward(step_batch, False).logits  # [N, V] every row, request-major
        first = step_batch.query_start_loc[:-1] + torch.tensor(
            [len(f) - 1 for f in feeds], device=logits.device
        )
        for d in range(k_max):  # draft d+1: the last catch-up row (d = 0), then mask row d
            chain.draw(logits[first + d])  # [B, V]
        for request in inputs.requests:  # the mask rows are never committed: roll them back next step
            self._fed[request.request_id] = _Fed(start=request.num_tokens, drafts=0)
        return chain.output(inputs.budgets)

    def _roll_back(self, inputs: DraftInputs, start: int) -> list[list[int]]:
        """Truncate each request's draft cache to its committed prefix; return the tokens to feed."""
        cache = self._runner().cache
        feeds: list[list[int]] = []
        for b, request in enumerate(inputs.requests):
            slot = start + b
            fed = self._fed.setdefault(request.request_id, _Fed())
            held = cache.lengths[slot]
            kept = (
                held
                if fed.start is None
                else min(held, fed.start + min(inputs.accepted.num_accepted[b], fed.drafts))
            )
            kept = min(kept, request.num_tokens - 1)  # the newest token is never cached yet
            cache.truncate(slot, kept)
            self._fed[request.request_id] = _Fed(start=kept, drafts=0)
            prompt = request.prompt_token_ids
            tail = prompt[kept:] + request.output_token_ids if kept < len(prompt) else []
            feeds.append(tail or request.output_token_ids[kept - len(prompt) :])
        return feeds


def build_draft_model_drafter(ctx: DrafterContext) -> DraftModelDrafter:
    """Load ``speculative_config.model`` and check it against the target (vocabulary, tokenizer, TP)."""
    config = ctx.config
    path = ctx.model_path("a folder or a .gguf file")
    tp = config.draft_tensor_parallel_size
    if tp not in (None, 1):
        raise ValueError(f"draft_tensor_parallel_size must be 1 in the embedded engine, got {tp}")
    dtype = None
    if config.draft_model_config is not None and config.draft_model_config.dtype not in (None, "auto"):
        from spec_backend.runtime.loader import resolve_dtype

        dtype = resolve_dtype(str(config.draft_model_config.dtype))
    model = ctx.load_model(path, dtype)
    check_vocab(ctx, model, path)
    check_positions(model, path, ctx.max_model_len)
    assert config.num_speculative_tokens is not None
    k, tree = config.num_speculative_tokens, branching_tree(config.token_tree)
    if config.parallel_drafting and (tree is not None or config.tree_top_k or config.tree_paths):
        raise ValueError(
            "parallel_drafting=True drafts a chain in one forward; it cannot draft a token tree "
            f"(speculative_token_tree={config.speculative_token_tree!r}, tree_top_k={config.tree_top_k!r}, "
            f"tree_paths={config.tree_paths!r}): "
            "use one or the other"
        )
    drafter = DraftModelDrafter(
        model,
        k,
        ctx.max_model_len,
        config.uses_draft_probs,
        ctx.backend,
        ctx.enforce_eager,
        pard_token(model, path) if config.parallel_drafting else None,
    )
    # a static tree's level feeds up to every node; a dynamic one's (or paths'), its frontier and ancestors
    drafter.headroom = max(k, len(tree or ()), (config.tree_top_k or config.tree_paths or 0) * k)
    drafter.drafts_trees = tree is not None or bool(config.tree_top_k or config.tree_paths)
    return drafter


__all__ = ["DraftModelDrafter", "build_draft_model_drafter"]
