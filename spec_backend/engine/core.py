"""The speculative loop with continuous batching: forward → verify → accept → draft-next.

Running requests occupy slots ``0 .. n-1`` of every cache in the slot table, in ``running`` order. One
``step``:

1. admit waiting requests (up to the preallocated slots) and prefill them in their own forward; the
   sampler picks each one's first token (K=0), then the drafter drafts their next step;
2. decode every running request: one target forward over ``[last token] + drafts`` (drafts from the
   previous step's draft-next), the rejection sampler picks accepted drafts + one recovered/bonus token,
   the target cache rolls back to the accepted length, stop checks run;
3. draft-next: the drafter receives this step's batch, the target's output (logits and declared hidden
   states) and the accepted tokens, and returns the next step's drafts (budget: K capped by each
   request's remaining tokens and cache room; 0 when the batch reaches ``disable_by_batch_size``);
4. finished requests leave (their slots are freed in every cache).

A failure while processing one request (drafting, its forward, its tokens) ends that request with
``finish_reason="error"``; the others go on. With async scheduling (``lookahead.py``) a plain decode step
is launched before the host lands the one before it: step 2's stop checks for step n run while step n+1
runs on the device.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from spec_backend.engine.adaptive import AdaptiveDraftLength
from spec_backend.engine.confidence import ConfidenceVerification
from spec_backend.engine.lookahead import Lookahead
from spec_backend.engine.pending import PendingDrafts
from spec_backend.engine.prefix import PrefixHits
from spec_backend.engine.request import Request
from spec_backend.engine.sampling_state import SamplingState
from spec_backend.engine.stepper import Stepper
from spec_backend.engine.tree_step import Plan
from spec_backend.engine.verify import Verifier
from spec_backend.metrics import SpecDecodingMetrics
from spec_backend.proposers.contract import Drafter, DraftOutput
from spec_backend.runtime.captured import CapturedDecode
from spec_backend.runtime.runner import ModelRunner
from spec_backend.runtime.slots import SlotTable

logger = logging.getLogger("spec_backend.engine")


class EngineStateError(RuntimeError):
    """The engine's own bookkeeping is inconsistent (a bug or an interrupted step); it is reset."""


class EngineCore:
    """Schedules requests over a target ``ModelRunner`` with an optional drafter (module docstring)."""

    def __init__(
        self,
        runner: ModelRunner,
        slots: SlotTable,
        verifier: Verifier,
        drafter: Drafter | None,
        num_speculative_tokens: int,
        max_num_seqs: int,
        disable_by_batch_size: int | None,
        metrics: SpecDecodingMetrics,
        tokenizer: Any | None,
        adaptive: AdaptiveDraftLength | None = None,
        prefix: PrefixHits | None = None,
        confidence: ConfidenceVerification | None = None,
        tree: Plan | None = None,
        async_scheduling: bool = False,
    ) -> None:
        self.runner = runner
        self.slots = slots
        self.verifier = verifier
        self.drafter = drafter
        self.k = num_speculative_tokens if drafter is not None else 0
        self.max_num_seqs = min(max_num_seqs, slots.capacity)
        self.disable_by_batch_size = disable_by_batch_size
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        device = runner.cache.layout.device
        self.pending = PendingDrafts(slots.capacity, device)
        self.sampling_state = SamplingState(slots.capacity, device)
        slots.join(self.pending)
        slots.join(self.sampling_state)
        self.captured: CapturedDecode | None = None  # set by the LLM when graphs are captured
        self.captured_plain: CapturedDecode | None = None  # a chain engine's one-token step (no drafts)
        self.prefix = prefix  # automatic prefix caching (engine/prefix.py), None when off
        self.adaptive = adaptive if self.k else None  # greedy requests' draft length per step (adaptive.py)
        if self.adaptive is not None and drafter is not None and tree is None:
            self.adaptive.shadowed = drafter.can_shadow
        self.confidence = confidence if self.k else None  # drafts verified per request (confidence.py)
        self.tree = tree if self.k else None  # a token tree drafted and verified each step
        if self.confidence is not None and self.adaptive is not None:
            logger.info("adaptive_draft_length: the drafter's confidences choose each request's draft length")
            self.adaptive = None  # one policy: the confidence scheduler measures the same step costs
        self._next_k = self.k  # the draft length greedy requests got at the last draft-next
        self._holding: list[Request] | None = None  # the batch the last draft-next's plan tried to hold
        self.num_steps = 0
        self.stepper = Stepper(self)
        #: plain steps launched before the host lands the step before them (``lookahead.py``); None: off
        self.lookahead = Lookahead(self) if async_scheduling else None
        #: the backend's ``start_host_copy`` where it ``reads_early`` (set by the LLM): a step launched ahead
        #: starts its packed output's copy to the host as soon as it is queued; None: reads wait for all
        #: queued work, so each step is read before the next is launched
        self.host_copy: Callable[[torch.Tensor], Callable[[], torch.Tensor]] | None = None

    @property
    def max_model_len(self) -> int:
        return self.runner.cache.max_len

    @property
    def next_draft_length(self) -> int:
        """The draft length greedy requests got at the last draft-next (adaptive drafting's choice)."""
        return self._next_k

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def check_invariants(self) -> None:
        """Raise ``EngineStateError`` unless every live cache slot belongs to a running request and no
        forward is half-way (the state a step starts from)."""
        if self.slots.num_slots != len(self.running) or not self.slots.consistent():
            raise EngineStateError(
                f"engine state is inconsistent: {self.slots.num_slots} cache slot(s) for {len(self.running)} "
                f"running request(s), caches {'in step' if self.slots.consistent() else 'out of step'}"
            )

    def ensure_idle(self) -> None:
        """Before new work: nothing waiting or running and no cache slot. A leftover (from an interrupted
        step that could not clean up) is logged and cleared, so it can never leak into new requests."""
        try:
            self.check_invariants()
            stale = self.has_unfinished()
        except EngineStateError as exc:
            stale, reason = True, str(exc)
        else:
            reason = f"{len(self.waiting)} waiting and {len(self.running)} running request(s) left over"
        if stale:
            logger.error("engine was not idle before new work (%s); clearing it", reason)
            self.abort_all("engine reset: request left over from an interrupted call")

    def step(self) -> list[Request]:
        """Run one scheduling step; return the requests that finished during it."""
        self.check_invariants()
        finished: list[Request] = []
        admitted: list[Request] = []
        limit = min(self.max_num_seqs, self.slots.capacity)  # a cap raised after start-up meets the slots
        ahead = self.lookahead
        if ahead is not None and ahead.drains(self.running, bool(self.waiting) and len(self.running) < limit):
            finished += self._release_finished()
        while self.waiting and len(self.running) + len(admitted) < limit:
            admitted.append(self.waiting.popleft())
        if admitted:
            self._admit(admitted)
            self.stepper.prefill(len(self.running) - len(admitted), admitted)
            finished += self._release_finished()
        if self.running:
            self.num_steps += 1
            if ahead is not None and ahead.ready(self.running):
                ahead.step(list(self.running))
            else:
                self._timed_decode()
            finished += self._release_finished()
        return finished

    def _timed_decode(self) -> None:
        """One decode step; with adaptive drafting, its time is measured with the drafts it verified. A
        step that verifies one draft length and drafts another is not: its time holds the next length's
        proposal (K forwards of a draft model), and a switch to K would pass for a plain step."""
        if self.confidence is not None and self.confidence.timed:
            tokens = len(self.running) + self.pending.total
            start = self.confidence.clock()
            self.stepper.decode(list(self.running))
            self.confidence.observe(tokens, self.confidence.clock() - start)
            return
        if self.adaptive is None or self.speculation_disabled:  # a step without speculation is no sample
            self.stepper.decode(list(self.running))
            return
        verified_k, running, total = self._next_k, list(self.running), self.metrics.total
        # nothing to verify (a plain step): the counts stay as they are, and none is read per request
        drafted = [r.stats.num_draft_tokens for r in running] if self.pending.total else None
        accepted = total.num_accepted_tokens
        start = self.adaptive.clock()
        self.stepper.decode(running)
        seconds = self.adaptive.clock() - start
        if verified_k == self._next_k:
            drafts = [0] * len(running)
            if drafted is not None:
                drafts = [r.stats.num_draft_tokens - d for r, d in zip(running, drafted, strict=True)]
            accepted = total.num_accepted_tokens - accepted
            self.adaptive.observe(len(running), verified_k, seconds, drafts, accepted)

    def plan_draft_length(self, requests: list[Request]) -> None:
        """Before a decode step's draft-next: the draft length of its greedy requests (``K`` without
        adaptive drafting; sampled requests always get ``K``)."""
        if self.adaptive is None:
            return
        greedy = [r for r in requests if not r.finished and r.params.temperature == 0]
        self.adaptive.resolve_shadows(greedy)
        estimate = self.adaptive.acceptance_of
        acceptances = [
            estimate(r.stats.num_draft_tokens, r.stats.num_accepted_tokens, r.request_id) for r in greedy
        ]
        mixed = any(not r.finished and r.params.temperature != 0 for r in requests)
        self._next_k = self.adaptive.choose(len(requests), acceptances, mixed)
        drafter, whole = self.drafter, len(greedy) == len(requests)  # else a request leaves or verifies
        self._holding = None
        if drafter is not None and drafter.defers_follow and self.tree is None and whole:
            self._holding = greedy
            self.adaptive.hold(greedy, drafter.can_shadow)

    def holds_plain(self, requests: list[Request]) -> bool:
        """Whether this decode step's draft-next is skipped: no request drafts, and the drafter
        ``defers_follow`` (it is handed the tokens at its next call). Speculation is off for the batch, or
        adaptive drafting holds plain decoding (``AdaptiveDraftLength.hold``: nothing it reads can change
        before the step it set), so the step costs what a plain step does."""
        drafter = self.drafter
        if drafter is None or not drafter.defers_follow or self.tree is not None:
            return False
        if self.speculation_disabled:
            return True
        return self.adaptive is not None and self.adaptive.held(requests)

    def shadow_budgets(self, requests: list[Request]) -> tuple[int, ...] | None:
        """For a step that drafts for no request: ``K`` for the greedy requests due a shadow, 0 for the
        others (``shadow_drafts.py``); ``None`` when none is due or nothing adapts."""
        adaptive = self.adaptive
        if adaptive is None or self.tree is not None or self.speculation_disabled:
            return None
        budgets = tuple(
            self._budget(r, self.k)
            if r.params.temperature == 0 and adaptive.shadows.due(r, adaptive.steps)
            else 0
            for r in requests
        )
        return budgets if any(budgets) else None

    def record_shadows(
        self, requests: list[Request], budgets: tuple[int, ...], drafts: list[list[int]]
    ) -> None:
        """The drafts of a step's shadows (``shadow_budgets``), kept for the adaptive policy. Shadows that
        found no draft leave nothing to resolve and only lower the reach, so a plain-decoding choice that
        could not hold because they were due holds from this step on (``AdaptiveDraftLength.hold``):
        before, the step after them decided again, to the same choice, at a decision's and a drafter
        call's cost."""
        assert self.adaptive is not None
        shadowed = [b for b, budget in enumerate(budgets) if budget]
        self.adaptive.observe_shadows(  # the running batch's size (a prefill's group is part of it)
            len(self.running), [requests[b] for b in shadowed], [drafts[b] for b in shadowed]
        )
        holding, drafter = self._holding, self.drafter
        if holding is not None and drafter is not None and not any(drafts):
            self.adaptive.hold(holding, drafter.can_shadow)

    def _admit(self, requests: list[Request]) -> None:
        self._holding = None
        if self.adaptive is not None:
            self.adaptive.end_hold()  # the batch changes
        for request in requests:
            slot = self.slots.add()
            self.sampling_state.admit(slot, request)
            if self.prefix is not None:
                self.prefix.admit(slot, request)
            self.running.append(request)
            if self.drafter is not None:
                try:
                    self.drafter.add_request(request)
                except Exception as exc:
                    request.fail(f"drafter failed: {type(exc).__name__}: {exc}")

    def verify_lengths(
        self, requests: list[Request], out: DraftOutput, budgets: tuple[int, ...]
    ) -> tuple[int, ...]:
        """How many of its drafts each request verifies: its budget, or fewer as the drafter's confidences
        decide (``confidence.py``); the choice is recorded in the metrics."""
        if self.confidence is None or out.confidence is None:
            return budgets
        available = [min(n, b) for n, b in zip(out.num_draft_tokens, budgets, strict=False)]
        adapts = [r.params.temperature == 0 or r.params.seed is None for r in requests]
        lengths = self.confidence.lengths(out.confidence.tolist(), available, adapts)
        self.metrics.observe_verify_lengths(lengths, available)
        return tuple(lengths)

    def draft_budget(self, request: Request) -> int:
        """Drafts worth proposing: a step verifying ``b`` drafts emits up to ``b + 1`` tokens (the accepted
        drafts, then the bonus token), and neither ``max_tokens`` nor ``max_model_len`` may be passed, so
        ``b + 1`` is at most what is left of each."""
        k = self._next_k if self.adaptive is not None and request.params.temperature == 0 else self.k
        return self._budget(request, k)

    def _budget(self, request: Request, k: int) -> int:
        if request.finished:
            return 0
        room = self.max_model_len - request.num_tokens
        return max(0, min(k, request.remaining - 1, room - 1))

    @property
    def speculation_disabled(self) -> bool:
        limit = self.disable_by_batch_size
        return self.drafter is None or self.k == 0 or (limit is not None and len(self.running) >= limit)

    # -- leaving -------------------------------------------------------------------------------------
    def _release_finished(self) -> list[Request]:
        """Remove finished requests, keeping the live cache slots packed."""
        done: list[Request] = []
        for i in reversed(range(len(self.running))):
            request = self.running[i]
            if not request.finished:
                continue
            done.append(request)
            self._forget(request, report=request.finish_reason != "error")
            last = len(self.running) - 1
            if i != last:
                self.running[i] = self.running[last]
            self.running.pop()
            self.slots.free(i)
        if not self.running and self.lookahead is not None:
            self.lookahead.clear()  # every request of a step in flight ended (or was aborted): its
            # tokens are dropped, and no later admission may land it
        return done[::-1]

    def _forget(self, request: Request, report: bool) -> None:
        if self.prefix is not None:
            self.prefix.forget(request.request_id)
        if self.adaptive is not None:
            self.adaptive.shadows.forget(request.request_id)
            self.adaptive.end_hold()
        if self.drafter is None:
            return
        if self.drafter.defers_follow:  # the held steps' tokens (a suffix proposer caches the whole
            # response when the request leaves); its output is complete: a failure is the drafter's alone
            error = self.drafter.take_tokens([request], [request.unseen_tokens()])[0]
            if error is not None:
                logger.error("drafter failed to take request %s's last tokens: %s", request.request_id, error)
        try:
            if report:
                request.kv_transfer_params = self.drafter.finish_request(request)
        except Exception as exc:
            request.fail(f"drafter failed when the request finished: {type(exc).__name__}: {exc}")
        try:
            self.drafter.remove_request(request.request_id)
        except Exception:  # forgetting a request must not fail the step
            logger.exception("drafter failed to forget request %s", request.request_id)

    def abort(self, request: Request, message: str) -> None:
        """End one request now (e.g. its client went away): out of the queue, or out of its cache slot,
        so the slot serves the next request at once. A finished or unknown request is left alone."""
        if request.finished:
            return
        if any(r is request for r in self.waiting):
            self.waiting = deque(r for r in self.waiting if r is not request)
            request.fail(message)
        elif any(r is request for r in self.running):
            request.fail(message)
            self._release_finished()

    def abort_all(self, message: str) -> list[Request]:
        """Fail every waiting and running request (used when the whole engine cannot continue)."""
        pending = [*self.running, *self.waiting]
        for request in pending:
            if not request.finished:
                request.fail(message)
            self._forget(request, report=False)
        self.waiting.clear()
        self.running.clear()
        if self.lookahead is not None:
            self.lookahead.clear()
        self.slots.reset()
        self.runner.cache.end_step()
        return pending


def seed_for(rng: random.Random) -> int:
    """A fresh 63-bit request seed from the engine's generator."""
    return rng.getrandbits(63)


__all__ = ["EngineCore", "EngineStateError", "seed_for"]
