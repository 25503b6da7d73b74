"""One engine step over a group of requests: forward → verify → accept → draft-next, with isolation.

A group is a contiguous slot range (a prefill's admitted requests, or every running request). When the
forward or the verification of a group fails, each request is retried alone so that only the failing
one ends with ``finish_reason="error"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from spec_backend.engine.logits import record_logprobs, record_prompt_logprobs
from spec_backend.engine.pending import DecodeInputs
from spec_backend.engine.request import Request
from spec_backend.engine.spec_ahead import land_ahead, launch_ahead
from spec_backend.engine.step_result import Launched, StepResult, moved_rows, one_token_rows
from spec_backend.engine.tree_step import nodes_within, refuse_grammars, verify_trees
from spec_backend.proposers.contract import AcceptedTokens, DraftInputs, DraftOutput
from spec_backend.runtime.captured import step_graph
from spec_backend.runtime.captured_verify import verify_kind
from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID
from spec_backend.step import StepBatch, TargetOutput, build_step_batch, valid_drafts

if TYPE_CHECKING:
    from spec_backend.engine.pending import PendingDrafts
    from spec_backend.engine.prefix import PrefixHits
    from spec_backend.engine.sampling_state import SamplingState
    from spec_backend.engine.tree_step import Plan
    from spec_backend.engine.verify import Verifier
    from spec_backend.metrics import SpecDecodingMetrics
    from spec_backend.proposers.contract import Drafter
    from spec_backend.runtime.captured import CapturedDecode
    from spec_backend.runtime.runner import ModelRunner
    from spec_backend.runtime.slots import SlotTable
    from spec_backend.sampling.sampling_metadata import SamplingMetadata


class StepEngine(Protocol):
    """What a step reads and updates: the collaborators the engine (``EngineCore``) holds, and its rules
    for the draft budget and for turning speculation off."""

    runner: ModelRunner
    slots: SlotTable
    verifier: Verifier
    drafter: Drafter | None
    pending: PendingDrafts
    sampling_state: SamplingState
    captured: CapturedDecode | None
    captured_plain: CapturedDecode | None
    prefix: PrefixHits | None
    metrics: SpecDecodingMetrics
    tokenizer: Any
    tree: Plan | None
    running: list[Request]
    host_copy: Callable[[torch.Tensor], Callable[[], torch.Tensor]] | None

    @property
    def max_model_len(self) -> int: ...

    @property
    def speculation_disabled(self) -> bool: ...

    def draft_budget(self, request: Request) -> int: ...

    def plan_draft_length(self, requests: list[Request]) -> None: ...

    def verify_lengths(
        self, requests: list[Request], out: DraftOutput, budgets: tuple[int, ...]
    ) -> tuple[int, ...]: ...

    def shadow_budgets(self, requests: list[Request]) -> tuple[int, ...] | None: ...

    def holds_plain(self, requests: list[Request]) -> bool: ...

    def record_shadows(
        self, requests: list[Request], budgets: tuple[int, ...], drafts: list[list[int]]
    ) -> None: ...


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _widen(inputs: DecodeInputs, k: int) -> DecodeInputs:
    """Pad the query tokens to ``[B, K+1]`` with placeholders (and the probabilities to ``[B, K, V]``)."""
    tokens, probs = inputs.tokens, inputs.probs
    extra = k + 1 - tokens.shape[1]
    if extra > 0:
        tokens = torch.nn.functional.pad(tokens, (0, extra), value=PLACEHOLDER_TOKEN_ID)
        if probs is not None:
            probs = torch.nn.functional.pad(probs, (0, 0, 0, extra))
    return replace(inputs, tokens=tokens, probs=probs)


def _graph_kind(
    captured: CapturedDecode | None, requests: list[Request], inputs: DecodeInputs, sampling: SamplingMetadata
) -> str | None:
    """The kind of the captured sampler's graphs that verifies this step (``captured_verify``), or None:
    no captured step, or one the graphs do not cover (draft probabilities, logits processors, structured
    outputs, top-k or top-p), verified eagerly after the forward."""
    if captured is None or captured.verify is None or inputs.probs is not None:
        return None
    if any(r.params.processes_logits or r.grammar is not None for r in requests):
        return None
    kind = verify_kind(sampling)
    return kind if kind in captured.verify.runners else None


class Stepper:
    """Runs the prefill and decode stages of ``EngineCore.step`` (see the module docstring)."""

    def __init__(self, engine: StepEngine) -> None:
        self.engine = engine

    @property
    def device(self) -> torch.device:
        return self.engine.runner.cache.layout.device

    def prefill(self, start: int, requests: list[Request]) -> None:
        """Prefill newly admitted requests (slots ``start ..``), sample their first tokens, draft. A request
        with a prefix-cache hit feeds the prompt positions after it."""
        lens = [len(r.prompt_token_ids) - r.num_cached_tokens for r in requests]
        tokens = torch.zeros((len(requests), max(lens)), dtype=torch.int64)  # [B, P]
        for b, request in enumerate(requests):
            fed = request.prompt_token_ids[request.num_cached_tokens :]
            tokens[b, : lens[b]] = torch.tensor(fed, dtype=torch.int64)
        self._group(start, requests, DecodeInputs(tokens.to(self.device), [0] * len(requests), None), True)

    def decode(self, requests: list[Request]) -> None:
        """One speculative step for every running request (slots ``0 ..``)."""
        inputs = self.engine.pending.take(0, requests, self.device)
        self._group(0, requests, inputs, False)

    def launch(self, requests: list[Request], ahead: Launched | None, speculative: bool = False) -> Launched:
        """A decode step of every running request (slots ``0 ..``) launched, not read or landed
        (``lookahead.py``). Without ``ahead``, the synchronous step's inputs (its drafts waiting); a plain
        step's query tokens are otherwise the tokens ``ahead`` emitted, on the device, and its RNG counters
        count them. ``speculative``: a verify step launched ahead (``spec_ahead.py``). From the device
        where the step's graphs allow (``launch_ahead``), else from host values."""
        launched = launch_ahead(self.engine, requests, ahead, speculative) if ahead is not None else None
        if launched is None:
            if ahead is None:
                inputs = self.engine.pending.take(0, requests, self.device)
            else:
                tokens = ahead.next_tokens(requests)  # [B, 1]
                inputs = DecodeInputs(tokens, [0] * len(requests), None, [()] * len(requests))
            result = self._run(0, requests, inputs, False, 0 if ahead is None else 1)
            launched = Launched(list(requests), result, speculative)
        # where the backend reads early, the copy is queued now: its read waits for this step alone
        copy = self.engine.host_copy
        return launched if copy is None else launched.copying(copy)

    def land(self, launched: Launched, successor: bool) -> None:
        """A launched step's tokens appended (stop checks, detokenization, metrics), then the draft-next,
        as a synchronous one-token step does; a request that finished since the launch drops its token.
        The cache is not rolled back: a one-token step keeps its position, and the next step may hold the
        next already. Where requests left since the launch (their slots moved), the draft-next sees the
        requests running now in their slots, as the synchronous step of that batch would. ``successor``:
        the next step is in flight, launched plain (``lookahead.py``): the draft-next only counts a held
        step (``EngineCore.holds_plain``); its drafter, which defers following, is handed the tokens later."""
        if launched.speculative:
            land_ahead(self, launched, successor)
            return
        result, requests, running = launched.result.read(), launched.requests, self.engine.running
        kept = self.append_emitted(0, requests, result, False, False)
        if successor:
            if self.engine.drafter is not None:  # a request that ended here ends the hold: the engine
                self.engine.holds_plain(requests)  # lands the successor before the next decision
            return
        index = moved_rows(requests, running)
        if index is None:
            self.draft_next(0, requests, result, False, kept)
        elif self.engine.drafter is not None and running:
            live = one_token_rows(result, index, self.engine.runner.cache.lengths)
            self.draft_next(0, list(running), live, False, [kept[i] for i in index])

    def _group(self, start: int, requests: list[Request], inputs: DecodeInputs, last_only: bool) -> None:
        lengths = self.engine.runner.cache.lengths
        saved = list(lengths)
        try:
            result = self._run(start, requests, inputs, last_only).read()
        except Exception as exc:
            lengths[: len(saved)] = saved  # undo this step's reservations
            if len(requests) == 1:
                requests[0].fail(f"step failed: {_error_text(exc)}")
                return
            for i, request in enumerate(requests):  # retry alone to find the failing request(s)
                self._group(start + i, [request], inputs.row(i), last_only)
            return
        self._accept(start, requests, result, last_only)

    def _run(
        self, start: int, requests: list[Request], inputs: DecodeInputs, last_only: bool, ahead: int = 0
    ) -> StepResult:
        engine = self.engine
        if engine.tree is not None and not last_only:
            return self._run_tree(start, requests, inputs)
        verify = engine.captured if not last_only and start == 0 else None
        captured = step_graph(verify, engine.captured_plain, len(requests), any(inputs.counts))
        if captured is not verify:  # no drafts: the one-token step, a plain step's cost
            inputs = replace(inputs, tokens=inputs.tokens[:, :1])  # [B, 1]
        if captured is not None:  # every request q tokens: placeholders where drafts are missing (an
            # eager step costs the host's launches of every layer, 10-20x a replay on a GPU)
            inputs = _widen(inputs, captured.q - 1)
            query_lens, drafts = [captured.q] * len(requests), [captured.q - 1] * len(requests)
        elif last_only:
            query_lens = [len(r.prompt_token_ids) - r.num_cached_tokens for r in requests]
            drafts = [0] * len(requests)
        else:
            query_lens, drafts = [1 + c for c in inputs.counts], list(inputs.counts)
        cached = engine.runner.cache.lengths[start : start + len(requests)]
        batch = build_step_batch(start, inputs.tokens, query_lens, cached, drafts)
        # before the forward: a copy from the host waits for the device's queue (pageable memory), so
        # none follows the forward's launch (``lookahead.py``: the host lands a step while it runs)
        sampling = self._sampling(start, requests, ahead)
        if captured is not None:
            target = captured.forward(batch)
        elif last_only and any(r.params.prompt_logprobs is not None for r in requests):
            target = engine.runner.forward(batch, False)  # every prompt row: [N, V]
            record_prompt_logprobs(requests, target.logits, query_lens)
            target = replace(target, logits=target.logits[batch.last_token_index])  # [B, V]
        else:
            target = engine.runner.forward(batch, last_only)
        kind = _graph_kind(captured, requests, inputs, sampling)
        if captured is not None and captured.verify is not None and kind is not None:
            packed = captured.verify.launch(kind, target.logits, inputs.tokens, sampling)
            return StepResult(batch, target, [], [], packed, True, sampling.positions, inputs.tokens[:, 0])
        flat_probs = None
        if inputs.probs is not None:  # [B, K_max, V] -> [T, V] in request order
            k_idx = torch.arange(inputs.probs.shape[1], device=inputs.probs.device)  # [K_max]
            flat_probs = inputs.probs[k_idx[None, :] < (batch.query_lens - 1)[:, None]]
        # [B]; None where no request has a draft column (a plain step): the verifier counts zero
        valid = None if last_only or inputs.tokens.shape[1] == 1 else valid_drafts(inputs.tokens)
        packed = engine.verifier.launch(
            batch, requests, target.logits, sampling, flat_probs, last_only, valid
        )
        return StepResult(batch, target, [], [], packed, True, sampling.positions, inputs.tokens[:, 0])

    def _sampling(self, start: int, requests: list[Request], ahead: int = 0) -> SamplingMetadata:
        """The step's sampling metadata; each request's first draft position is its RNG counter (``ahead``:
        tokens emitted but not appended yet, a step launched ahead)."""
        counters = [r.num_tokens + ahead for r in requests]
        positions = torch.tensor(counters, dtype=torch.int64).to(self.device)  # [B]
        return self.engine.sampling_state.metadata(start, positions)

    def _run_tree(self, start: int, requests: list[Request], inputs: DecodeInputs) -> StepResult:
        """A token-tree step (``tree_step``), returned in its chain view."""
        engine = self.engine
        refuse_grammars(requests)
        counts = [
            min(c, int(v)) for c, v in zip(inputs.counts, valid_drafts(inputs.tokens).tolist(), strict=True)
        ]
        cached = engine.runner.cache.lengths[start : start + len(requests)]
        parents, plan = inputs.parents, engine.tree
        assert parents is not None and plan is not None
        captured, width = engine.captured if start == 0 else None, None
        forward: Callable[[StepBatch, bool], TargetOutput] = engine.runner.forward
        if captured is not None:  # every request 1 + nodes tokens (padding nodes hang off the root)
            inputs, width = _widen(inputs, captured.q - 1), captured.q - 1
            forward = lambda batch, _: captured.forward(batch)  # noqa: E731
        out = verify_trees(
            requests, parents, start, inputs.tokens, counts, list(cached), forward,
            self._sampling(start, requests), engine.runner.cache.keep_path, engine.verifier.sampler.ops,
            width, inputs.probs, plan.paths,
        )  # fmt: skip
        return StepResult(out.batch, out.target, out.emitted, out.drafted)

    def _accept(self, start: int, requests: list[Request], result: StepResult, last_only: bool) -> None:
        kept = self.append_emitted(start, requests, result, last_only, True)
        self.draft_next(start, requests, result, last_only, kept)
        if last_only and self.engine.prefix is not None:
            self.engine.prefix.remember(start, requests, result.batch, result.target)

    def append_emitted(
        self, start: int, requests: list[Request], result: StepResult, last_only: bool, truncate: bool
    ) -> list[list[int]]:
        """Append each request's emitted tokens (stop checks, detokenization) and count the verification;
        each request's kept tokens. ``truncate``: roll each cache slot back to its kept tokens."""
        engine = self.engine
        kept_all: list[list[int]] = []
        drafted, accepted = [], []
        for i, (request, tokens) in enumerate(zip(requests, result.emitted, strict=True)):
            kept: list[int] = []
            if not request.finished:
                try:
                    if not last_only:
                        request.record_verification(result.drafted[i], len(tokens) - 1)
                        drafted.append(result.drafted[i])
                        accepted.append(len(tokens) - 1)
                    kept = request.append_tokens(tokens, engine.tokenizer, engine.max_model_len)
                    if truncate:  # the cache holds every token but the newest (the next step's first input)
                        engine.slots.truncate(start + i, request.num_tokens - 1)
                except Exception as exc:
                    request.fail(_error_text(exc))
            kept_all.append(kept)
        if any(r.params.logprobs is not None for r in requests):
            record_logprobs(requests, kept_all, result.target.logits, result.batch.query_lens_host, last_only)
        if drafted:
            engine.metrics.observe_many(drafted, accepted)
        return kept_all

    def draft_next(
        self, start: int, requests: list[Request], result: StepResult, last_only: bool, kept: list[list[int]]
    ) -> None:
        engine, drafter = self.engine, self.engine.drafter
        if drafter is None or (not last_only and engine.holds_plain(requests)):
            return  # a held plain step: the drafter is handed its tokens at its next call
        batch, target = result.batch, result.target
        if last_only and engine.prefix is not None:  # the drafter sees every prompt row
            batch, target = engine.prefix.drafter_view(start, requests, batch, target)
        disabled = engine.speculation_disabled
        if not disabled and not last_only:
            engine.plan_draft_length(requests)
        budgets = tuple(0 if disabled else engine.draft_budget(r) for r in requests)
        num_accepted = tuple(0 if last_only else max(0, len(e) - 1) for e in result.emitted)
        if drafter.defers_follow:  # the held steps' tokens too (``Drafter.defers_follow``)
            kept = [r.unseen_tokens() for r in requests]
        inputs = DraftInputs(
            batch=batch,
            target=target,
            accepted=AcceptedTokens(tuple(kept), num_accepted, last_only),
            requests=requests,
            budgets=budgets,
        )
        try:
            if not any(budgets) and self._idle(requests, inputs, drafter):
                return  # no drafts: ``pending.take`` left every count of these slots at 0
            if engine.tree is not None:  # the tree's nodes within each budget's depth
                out = engine.tree.draft(drafter, inputs)
                assert out.tree_parents is not None
                budgets = tuple(nodes_within(p, b) for p, b in zip(out.tree_parents, budgets, strict=True))
            else:
                out = drafter.propose(inputs)
        except Exception as exc:
            for request in requests:
                if not request.finished:
                    request.fail(f"drafter failed: {_error_text(exc)}")
            return
        self._followed(requests, out.errors)
        lengths = engine.verify_lengths(requests, out, budgets)
        if any(min(n, b) for n, b in zip(out.num_draft_tokens, lengths, strict=False)):
            # else every count stays 0 (``pending.take``) and the ids are never read
            engine.pending.store(result.batch.start, out, lengths, engine.runner.vocab_size)

    def _idle(self, requests: list[Request], inputs: DraftInputs, drafter: Drafter) -> bool:
        """A step that drafts for no request: the drafter shadows the requests due (``shadow_drafts``) or
        only takes in the tokens (``Drafter.follow``). Whether it could (else it is asked to propose)."""
        shadow = self.engine.shadow_budgets(requests)
        if shadow is not None:
            got = drafter.shadow(replace(inputs, budgets=shadow))
            if got is not None:
                drafts, errors = got
                self._followed(requests, errors)
                self.engine.record_shadows(requests, shadow, drafts)
                return True
        return self._followed(requests, drafter.follow(inputs))

    @staticmethod
    def _followed(requests: list[Request], errors: tuple[str | None, ...] | None) -> bool:
        """Fail the requests the drafter reported failing; whether it reported at all."""
        for request, error in zip(requests, errors or (), strict=False):
            if error is not None and not request.finished:
                request.fail(error)
        return errors is not None


__all__ = ["Stepper"]
