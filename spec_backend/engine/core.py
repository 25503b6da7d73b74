"""The speculative loop with continuous batching.

Running requests occupy cache slots ``0 .. n-1`` in ``running`` order. One ``step``:

1. admit waiting requests (up to ``max_num_seqs``) and prefill them in their own forward, sampling each
   one's first token (K=0 through the sampler);
2. propose up to K drafts per running request (capped by its remaining ``max_tokens`` and room in the
   model length; K=0 for everyone when the batch reaches ``disable_by_batch_size``);
3. one target forward over each request's ``[last token] + drafts`` (padded to the longest);
4. the rejection sampler picks accepted drafts + one recovered/bonus token per request;
5. each request's cache is rolled back to its accepted length, stop checks run, finished requests leave
   (the last slot moves into the freed one).

A failure while processing one request (its drafts, its forward, its tokens) ends that request with
``finish_reason="error"``; the others go on.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from spec_backend.engine.request import Request
from spec_backend.engine.runner import ModelRunner
from spec_backend.engine.verify import Verifier
from spec_backend.metrics import SpecDecodingMetrics

logger = logging.getLogger("spec_backend.engine")


class EngineStateError(RuntimeError):
    """The engine's own bookkeeping is inconsistent (a bug or an interrupted step); it is reset."""


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class EngineCore:
    """Schedules requests over a ``ModelRunner`` with an optional proposer (see module docstring)."""

    def __init__(
        self,
        runner: ModelRunner,
        verifier: Verifier,
        proposer: Any | None,
        num_speculative_tokens: int,
        max_num_seqs: int,
        disable_by_batch_size: int | None,
        metrics: SpecDecodingMetrics,
        tokenizer: Any | None,
    ) -> None:
        self.runner = runner
        self.verifier = verifier
        self.proposer = proposer
        self.k = num_speculative_tokens if proposer is not None else 0
        self.max_num_seqs = max_num_seqs
        self.disable_by_batch_size = disable_by_batch_size
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_steps = 0

    @property
    def max_model_len(self) -> int:
        return self.runner.cache.max_len

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def check_invariants(self) -> None:
        """Raise ``EngineStateError`` unless every live cache slot belongs to a running request and no
        forward is half-way (the state a step starts from)."""
        cache = self.runner.cache
        if cache.num_slots != len(self.running) or cache.plan is not None:
            raise EngineStateError(
                f"engine state is inconsistent: {cache.num_slots} cache slot(s) for {len(self.running)} "
                f"running request(s), step plan {'open' if cache.plan is not None else 'closed'}"
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
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            admitted.append(self.waiting.popleft())
        if admitted:
            self._prefill(admitted)
            finished += self._release_finished()
        if self.running:
            self._decode()
            finished += self._release_finished()
        return finished

    # -- prefill -------------------------------------------------------------------------------------
    def _prefill(self, requests: list[Request]) -> None:
        start = len(self.running)
        for request in requests:
            self.runner.cache.add_slot()
            self.running.append(request)
            self._guard(
                request, lambda r: self._proposer_call("add_request", r.request_id, r.prompt_token_ids)
            )
        prompts = [r.prompt_token_ids for r in requests]
        self._forward_and_sample(start, requests, prompts, [[] for _ in requests], last_only=True)

    # -- one speculative step ------------------------------------------------------------------------
    def _decode(self) -> None:
        requests = list(self.running)  # all unfinished: finished ones were released after prefill
        drafts = self._propose(requests)
        inputs = [[r.output_token_ids[-1], *d] for r, d in zip(requests, drafts, strict=True)]
        self.num_steps += 1
        self._forward_and_sample(0, requests, inputs, drafts, last_only=False)

    def _draft_budget(self, request: Request) -> int:
        """Drafts worth proposing: the step emits up to K+1 tokens, and the cache must hold K+1 more."""
        room = self.max_model_len - request.num_tokens
        return max(0, min(self.k, request.remaining - 1, room))

    def _propose(self, requests: list[Request]) -> list[list[int]]:
        disabled = self.disable_by_batch_size is not None and len(requests) >= self.disable_by_batch_size
        if self.proposer is None or self.k == 0 or disabled:
            return [[] for _ in requests]
        budgets = [self._draft_budget(r) for r in requests]
        ids = [r.request_id for r in requests]
        try:
            drafts: list[list[int]] = self.proposer.propose(ids, max_tokens=budgets)
        except Exception:  # isolate the failing request: propose one by one
            drafts = []
            for request, budget in zip(requests, budgets, strict=True):
                try:
                    drafts.append(list(self.proposer.propose([request.request_id], max_tokens=[budget])[0]))
                except Exception as exc:
                    request.fail(f"proposer failed: {_error_text(exc)}")
                    drafts.append([])
        vocab = self.runner.vocab_size
        return [
            [int(t) for t in d[:b]] if all(0 <= int(t) < vocab for t in d) else []
            for d, b in zip(drafts, budgets, strict=True)
        ]

    # -- forward + sampling with per-request isolation -----------------------------------------------
    def _forward_and_sample(
        self,
        start: int,
        requests: list[Request],
        inputs: list[list[int]],
        drafts: list[list[int]],
        last_only: bool,
    ) -> None:
        saved = list(self.runner.cache.lengths)
        try:
            emitted = self._run(start, requests, inputs, drafts, last_only)
        except Exception as exc:
            self.runner.cache.lengths[: len(saved)] = saved  # undo this step's reservations
            if len(requests) == 1:
                requests[0].fail(f"step failed: {_error_text(exc)}")
                return
            for i, request in enumerate(requests):  # retry alone to find the failing request(s)
                if request.finished:
                    continue
                try:
                    one = self._run(start + i, [request], [inputs[i]], [drafts[i]], last_only)
                except Exception as inner:
                    self.runner.cache.lengths[start + i] = saved[start + i]
                    request.fail(f"step failed: {_error_text(inner)}")
                    continue
                self._accept(start + i, request, drafts[i], one[0], last_only)
            return
        for i, (request, tokens) in enumerate(zip(requests, emitted, strict=True)):
            self._accept(start + i, request, drafts[i], tokens, last_only)
        if not last_only:
            self.metrics.observe_many([len(d) for d in drafts], [len(t) - 1 for t in emitted])

    def _run(
        self,
        start: int,
        requests: list[Request],
        inputs: list[list[int]],
        drafts: list[list[int]],
        last_only: bool,
    ) -> list[list[int]]:
        live = [not r.finished for r in requests]
        if not all(live):  # a request failed while proposing: feed it a dummy row, drop its result
            inputs = [x if ok else x[:1] for x, ok in zip(inputs, live, strict=True)]
            drafts = [d if ok else [] for d, ok in zip(drafts, live, strict=True)]
        logits = self.runner.forward(start, inputs, last_only)  # [sum(K_b + 1), V] or [B, V]
        return self.verifier(requests, drafts, logits)

    def _accept(
        self, slot: int, request: Request, drafts: list[int], tokens: list[int], last_only: bool
    ) -> None:
        if request.finished:
            return

        def apply(r: Request) -> None:
            if not last_only:
                r.record_verification(len(drafts), len(tokens) - 1)
            kept = r.append_tokens(tokens, self.tokenizer)
            self._proposer_call("update", r.request_id, kept)
            # the cache holds every token but the newest (the next step's first input)
            self.runner.cache.truncate(slot, r.num_tokens - 1)
            if not r.finished and r.num_tokens >= self.max_model_len:
                r.finish_reason = "length"

        self._guard(request, apply)

    def _guard(self, request: Request, fn: Callable[[Request], None]) -> None:
        try:
            fn(request)
        except Exception as exc:
            request.fail(_error_text(exc))

    def _proposer_call(self, method: str, req_id: str, tokens: list[int]) -> None:
        if self.proposer is not None:
            getattr(self.proposer, method)(req_id, list(tokens))

    # -- leaving -------------------------------------------------------------------------------------
    def _release_finished(self) -> list[Request]:
        """Remove finished requests, keeping the live cache slots packed."""
        done: list[Request] = []
        cache = self.runner.cache
        for i in reversed(range(len(self.running))):
            request = self.running[i]
            if not request.finished:
                continue
            done.append(request)
            if self.proposer is not None:
                with contextlib.suppress(Exception):  # forgetting a request must not fail the step
                    self.proposer.remove_request(request.request_id)
            last = len(self.running) - 1
            if i != last:
                cache.move_slot(last, i)
                self.running[i] = self.running[last]
            self.running.pop()
            cache.pop_slot()
        return done[::-1]

    def abort_all(self, message: str) -> list[Request]:
        """Fail every waiting and running request (used when the whole engine cannot continue)."""
        pending = [*self.running, *self.waiting]
        for request in pending:
            if not request.finished:
                request.fail(message)
            if self.proposer is not None:
                with contextlib.suppress(Exception):
                    self.proposer.remove_request(request.request_id)
        self.waiting.clear()
        self.running.clear()
        self.runner.cache.reset()
        return pending


def seed_for(rng: random.Random) -> int:
    """A fresh 63-bit request seed from the engine's generator."""
    return rng.getrandbits(63)


__all__ = ["EngineCore", "EngineStateError", "seed_for"]
