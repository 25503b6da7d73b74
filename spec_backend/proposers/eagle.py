"""EAGLE-style drafters (``eagle``, ``eagle3``, ``mtp``): a head on the target's hidden states drafts K
tokens per step, one forward per draft (``spec_backend.models.chain_head`` has the glossary).

Alignment (as vLLM): the head's row ``t`` pairs the target's features of token ``t`` (the post-norm
final state for EAGLE-1 and MTP, auxiliary layer states through ``fc`` for EAGLE-3) with token ``t+1``
at position ``t`` and predicts token ``t+2``. After each step the drafter:

1. rolls its cache back to the rows fed with *target* hidden states (rows fed while drafting used the
   head's own outputs and are recomputed);
2. feeds this step's committed rows: a prefill's prompt rows, or a decode step's first row plus one row
   per accepted draft, each with the next committed token; the last row's output gives draft 1;
3. feeds each draft back with the previous output as its hidden state for drafts 2..K (one row per
   request: replayed from captured graphs where the backend captures them, ``captured_head``).

The catch-up runs every step, also when speculation is off for the batch: target hidden states exist
only now. Logits come from the head (``ChainHead.logits``: the target's LM head for EAGLE-1, the draft
vocabulary mapped through ``d2t`` for EAGLE-3); drafts are argmax or sampled (``draft_sampling``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from spec_backend.proposers.contract import DraftInputs, DraftOutput, DraftRequest, FlightTokens, empty_drafts
from spec_backend.proposers.draft_sampling import DraftChain
from spec_backend.proposers.dynamic_tree import Grower
from spec_backend.proposers.eagle_ahead import HeadAhead
from spec_backend.proposers.head_cache import HeadCacheDrafter
from spec_backend.proposers.layered_chain import LayeredChain, feed_other_layers
from spec_backend.proposers.sibling_draws import sampled_siblings, static_tree_output
from spec_backend.proposers.tree_build import depths_of, fill_static_batch
from spec_backend.step import HiddenStateRequest, StepBatch, build_tree_batch

if TYPE_CHECKING:
    from spec_backend.backends.base import Backend
    from spec_backend.models.chain_head import ChainHead
    from spec_backend.proposers.captured_head import CapturedHeadStep


class EagleDrafter(HeadCacheDrafter):
    """See the module docstring. ``hidden_states``: what ``head`` reads (final, or aux layer ids)."""

    def __init__(
        self,
        head: ChainHead,
        hidden_states: HiddenStateRequest,
        k: int,
        max_model_len: int,
        probabilistic: bool,
        mask_token_id: int | None = None,
    ) -> None:
        if hidden_states.final == bool(hidden_states.aux_layer_ids):
            raise ValueError(
                f"an EAGLE-style head reads either the final state or aux layers, got {hidden_states}"
            )
        super().__init__(head.config, next(head.parameters()), hidden_states, k, max_model_len, probabilistic)
        self.head = head
        self.mask_token_id = mask_token_id  # parallel drafting (P-EAGLE) when set
        #: the backend that captures drafts 2..K's one-row steps (None: eager), set by the builder for
        #: a chain; the graphs are captured with the cache (``allocate_caches``)
        self.capture_backend: Backend | None = None
        self.step_graph: CapturedHeadStep | None = None
        self.ahead: HeadAhead | None = None  # greedy chains over device lengths: drafting ahead
        #: per request, its tokens when it was last drafted K (else -1): the step verifying them is a
        #: K+1-row step, whose rows drafting ahead feeds (``ready_ahead``)
        self._chained: dict[str, int] = {}

    def allocate_caches(self, num_slots: int) -> None:
        from spec_backend.proposers.captured_head import capture_head_step

        super().allocate_caches(num_slots)
        self.step_graph = None
        if self.num_speculative_tokens > 1 and self.mask_token_id is None:
            # argmax drafts: drafts 2..K as one graph too (where the backend captures chains)
            chain = 0 if self.probabilistic else self.num_speculative_tokens - 1
            self.step_graph = capture_head_step(
                self.head, self._cache(), self.capture_backend, num_slots, chain
            )
        graph = self.step_graph
        ahead = graph is not None and graph.committed_graph is not None and graph.chain_graph is not None
        self.ahead = HeadAhead(self.head, graph, self.hidden_states.final) if graph and ahead else None
        self.drafts_ahead = self.ahead is not None

    def propose_ahead(
        self, requests: Sequence[DraftRequest], flight: FlightTokens, budgets: Sequence[int]
    ) -> torch.Tensor:  # [B, K]
        """K greedy drafts per request after ``flight`` (``eagle_ahead``; budgets are K there)."""
        if self.ahead is None:
            raise NotImplementedError("this head drafts ahead only as a captured greedy chain")
        return self.ahead.propose(flight)

    def ready_ahead(self, requests: Sequence[DraftRequest]) -> bool:
        """Every live slot replays from 0 within the captured sizes (``goes_ahead``), each request's
        committed rows are its tokens but the newest (the catch-up ran at its last step) and it was drafted
        K there: the step in flight verifies K+1 rows (not one after speculation was off: one row)."""
        graph = self.step_graph
        return (
            self.ahead is not None
            and graph is not None
            and graph.goes_ahead(len(requests))
            and all(
                self._rows.get(r.request_id) == r.num_tokens - 1 == self._chained.get(r.request_id, -1) - 1
                for r in requests
            )
        )

    def landed_ahead(self, requests: Sequence[DraftRequest | None]) -> None:
        """Each live request's cache holds its committed rows and the chain's, as after a draft-next."""
        if self.ahead is None:
            raise RuntimeError("landed_ahead on a head that does not draft ahead")
        cache = self._cache()
        for slot, request_id, committed, length in self.ahead.landed(requests):
            cache.truncate(slot, length)
            self._rows[request_id], self._chained[request_id] = committed, committed + 1

    def remove_request(self, request_id: str) -> None:
        super().remove_request(request_id)
        self._chained.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        if self.mask_token_id is not None:
            return self._propose_parallel(inputs, *self._prepare(inputs))
        start, batch = inputs.batch.start, len(inputs.requests)
        out = self._feed_committed(inputs)  # [B, H] each request's last row
        k_max = max(inputs.budgets, default=0)
        for request, budget in zip(inputs.requests, inputs.budgets, strict=True):  # drafted K here or not
            self._chained[request.request_id] = (
                request.num_tokens if budget == self.num_speculative_tokens else -1
            )
        if k_max == 0:
            return empty_drafts(batch, self.num_speculative_tokens, out.device)
        chain = DraftChain(inputs.requests, self.probabilistic, out.device)
        graph, layered = self.step_graph, self._layered(start, batch)
        for step in range(k_max):
            ids = self._draw(chain, out, step)
            if step == 0 and graph is not None and graph.chains(start, batch, k_max):
                chain.extend(graph.forward_chain(ids, out))  # drafts 2..K: one replay
                break
            if step + 1 < k_max and layered is not None:
                out = layered.step(step + 1, ids, out)  # every layer over rows it computed
            elif step + 1 < k_max:
                out = self._run(start, ids[:, None], out[:, None], [1] * batch, step + 1)
        return chain.output(inputs.budgets)

    def _layered(self, start: int, batch: int) -> LayeredChain | None:
        """The chain of a head whose draft steps run different layers (``layered_chain``)."""
        layers = self.head.step_kinds()
        if layers == 1:
            return None
        forward = lambda tokens, hidden, lens, step: self._forward(start, tokens, hidden, lens, step)  # noqa: E731
        return LayeredChain(self._cache(), start, batch, layers, forward)

    @torch.inference_mode()
    def propose_tree(self, inputs: DraftInputs, parents: Sequence[int], ranks: Sequence[int]) -> DraftOutput:
        """A static tree, level by level: the children of a node are ranked by the head's logits on that
        node's output, and a level's forward feeds every node above it, each with its parent's output,
        under tree attention (``step.build_tree_batch``: a node sees the committed rows and its own
        ancestors, at position ``committed + depth - 1``) — each node's distribution is the one the chain
        through its path would give."""
        start, batch = inputs.batch.start, len(inputs.requests)
        outs = {-1: self._feed_committed(inputs)}  # node -> its head output [B, H]; -1: the last row
        base = list(self._cache().lengths[start : start + batch])  # the rows before the tree
        depths = depths_of(parents)

        def logits_at(parent: int, columns: Sequence[torch.Tensor]) -> torch.Tensor:  # -> [B, V]
            depth = depths[parent] if parent >= 0 else 0
            if parent not in outs:  # feed every node of depth <= depth (all filled, breadth first)
                fed = sum(d <= depth for d in depths)
                ids = torch.stack(list(columns[:fed]), dim=1)  # [B, fed]
                hidden = torch.stack([outs[p] for p in parents[:fed]], dim=1)  # [B, fed, H]
                out = self._tree_forward(start, ids, hidden, [parents[:fed]] * batch, base)  # [B, fed, H]
                outs.update({i: out[:, i] for i in range(fed)})
            return self.head.logits(outs[parent], depth).float()

        siblings = sampled_siblings(inputs.requests, self.probabilistic)
        tokens = fill_static_batch(parents, ranks, logits_at, siblings)  # [B, n]
        return static_tree_output(tokens, parents, ranks, siblings)

    @torch.inference_mode()
    def grower(self, inputs: DraftInputs) -> Grower:
        """EAGLE-2's trees and multi-path drafts (``proposers.dynamic_tree``, ``draft_paths``), each
        level's nodes fed as ``propose_tree`` feeds a static tree's levels."""
        start = inputs.batch.start
        root = self._feed_committed(inputs)  # [B, H]
        base = list(self._cache().lengths[start : start + len(inputs.requests)])

        def forward(
            columns: Sequence[Sequence[int]], ids: torch.Tensor, hidden: torch.Tensor
        ) -> torch.Tensor:
            return self._tree_forward(start, ids, hidden, columns, base)

        def log_probs(out: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V]
            logits = self.head.logits(out.reshape(-1, out.shape[-1])).float()  # [M, V]
            return torch.log_softmax(logits, dim=-1).view(*out.shape[:-1], -1)

        return Grower(root, forward, log_probs)

    def _tree_forward(
        self,
        start: int,
        tokens: torch.Tensor,  # [B, Q] the nodes fed, parents first (padded past each request's)
        hidden: torch.Tensor,  # [B, Q, H] each node's parent's output
        parents: Sequence[Sequence[int]],  # per request each fed node's parent column (-1: none)
        base: Sequence[int],  # [B] cache rows before the tree
    ) -> torch.Tensor:  # [B, Q, H]
        cache = self._cache()
        for b, rows in enumerate(base):  # drop the previous level's nodes
            cache.truncate(start + b, rows)
        return self._head_forward(build_tree_batch(start, tokens, parents, base), tokens, hidden, 0)

    def _prepare(self, inputs: DraftInputs) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Roll back to the rows fed with target features; this step's committed rows (``_committed``)."""
        rows_h = self.head.combine(self.features(inputs))  # [N, H]
        self.rollback(inputs)
        return self._committed(inputs, rows_h)

    def _feed_committed(self, inputs: DraftInputs) -> torch.Tensor:  # [B, H] each request's last row
        tokens, hidden, lens = self._prepare(inputs)
        start, cache = inputs.batch.start, self._cache()
        before = list(cache.lengths[start : start + len(lens)])
        out = self._run(start, tokens, hidden, lens)
        if self.head.step_kinds() > 1:  # every layer's rows at the committed positions (``layered_chain``)
            forward = lambda step: self._forward(start, tokens, hidden, lens, step)  # noqa: E731
            feed_other_layers(cache, start, before, self.head.step_kinds(), forward)
        self.mark_committed(inputs, lens)
        return out

    def _draw(self, chain: DraftChain, out: torch.Tensor, step: int) -> torch.Tensor:  # [B, H] -> [B]
        """Draft ``step + 1``: sampled over the target vocabulary when probabilistic (``q`` goes to the
        sampler), else the argmax over the head's own vocabulary, mapped to target ids."""
        if self.probabilistic:
            return chain.draw(self.head.logits(out, step).float())  # logits [B, V]
        logits, vocab = self.head.draft_vocab_logits(out, step)  # [B, Vd], [Vd] | None
        return chain.draw_greedy(logits, vocab)

    def _propose_parallel(
        self, inputs: DraftInputs, tokens: torch.Tensor, hidden: torch.Tensor, lens: list[int]
    ) -> DraftOutput:
        """P-EAGLE: K-1 mask rows after each request's committed rows, one causal forward, K drafts."""
        mask_h, extra = self.head.mask_features(), self.num_speculative_tokens - 1  # [H]
        assert mask_h is not None and self.mask_token_id is not None
        base = [max(1, n) for n in lens]  # a dummy row when nothing was committed
        batch, width = len(lens), max(base) + extra
        ids = tokens.new_full((batch, width), self.mask_token_id)  # [B, M + K - 1]
        rows = hidden.new_zeros((batch, width, hidden.shape[-1]))  # [B, M + K - 1, H]
        for b, n in enumerate(base):
            ids[b, :n], rows[b, :n], rows[b, n : n + extra] = tokens[b, :n], hidden[b, :n], mask_h
        out = self._forward(inputs.batch.start, ids, rows, [n + extra for n in base], 0)  # [B, Q, H]
        self.mark_committed(inputs, lens, trailing=extra)
        k_max = max(inputs.budgets, default=0)
        if k_max == 0:
            return empty_drafts(batch, self.num_speculative_tokens, out.device)
        first = torch.tensor([n - 1 for n in base], device=out.device)  # [B] last committed row
        picked = out[
            torch.arange(batch, device=out.device)[:, None],
            first[:, None] + torch.arange(k_max, device=out.device),
        ]
        chain = DraftChain(inputs.requests, self.probabilistic, out.device)
        for d in range(k_max):  # draft d+1 from the last committed row (d = 0) or mask row d
            chain.draw(self.head.logits(picked[:, d]).float())  # picked [B, k_max, H]
        return chain.output(inputs.budgets)

    def _committed(
        self, inputs: DraftInputs, rows_h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """This step's committed rows: tokens ``[B, M]`` (each row's next token), hidden ``[B, M, H]``,
        counts."""
        batch = inputs.batch
        loc = batch.query_start_loc_host
        rows: list[tuple[torch.Tensor, list[int]]] = []
        for b in range(len(inputs.requests)):
            kept = inputs.accepted.new_token_ids[b]
            if inputs.accepted.is_prefill:
                nxt = batch.input_ids[loc[b] + 1 : loc[b + 1]].tolist() + kept[:1]
            else:
                nxt = kept[: inputs.accepted.num_accepted[b] + 1]
            rows.append((rows_h[loc[b] : loc[b] + len(nxt)], nxt))
        width = max(1, max(len(t) for _, t in rows))
        tokens = torch.zeros((len(rows), width), dtype=torch.int64, device=rows_h.device)  # [B, M]
        hidden = rows_h.new_zeros((len(rows), width, rows_h.shape[1]))  # [B, M, H]
        for b, (h, nxt) in enumerate(rows):
            if nxt:
                tokens[b, : len(nxt)] = torch.tensor(nxt, dtype=torch.int64)
                hidden[b, : len(nxt)] = h
        return tokens, hidden, [len(t) for _, t in rows]

    def _run(
        self, start: int, tokens: torch.Tensor, hidden: torch.Tensor, lens: list[int], step: int = 0
    ) -> torch.Tensor:  # [B, H] each request's last row
        """One head forward; a request with nothing to feed gets a dummy row (not counted as committed).
        A draft step (``step > 0``: one row per request) replays its graph where one covers the batch."""
        graph = self.step_graph
        if graph is not None and step > 0 and graph.covers(start, len(lens)):
            return graph.forward(self.step_batch(start, tokens, lens), tokens, hidden)  # [B, H]
        out = self._forward(start, tokens, hidden, lens, step)  # [B, Q, H]
        last_col = torch.tensor([max(1, n) - 1 for n in lens], device=out.device)  # [B]
        last: torch.Tensor = out[torch.arange(len(lens), device=out.device), last_col]
        return last

    def _forward(
        self, start: int, tokens: torch.Tensor, hidden: torch.Tensor, lens: list[int], step: int
    ) -> torch.Tensor:  # [B, Q, H]
        return self._head_forward(self.step_batch(start, tokens, lens), tokens, hidden, step)

    def _head_forward(
        self, batch: StepBatch, tokens: torch.Tensor, hidden: torch.Tensor, step: int
    ) -> torch.Tensor:  # [B, Q, H]
        """The head over ``batch`` (``tokens [B, >= Q]``, ``hidden [B, >= Q, H]``) on its cache."""
        cache = self._cache()
        cache.begin_step(batch)
        try:
            out: torch.Tensor = self.head(
                tokens[:, : batch.max_query_len],
                hidden[:, : batch.max_query_len],
                batch.padded_positions(),
                cache,
                batch.attention,
                step,
            )
        finally:
            cache.end_step()
        return out


__all__ = ["EagleDrafter"]
