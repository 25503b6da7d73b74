"""Async scheduling: a plain decode step launched before the host has taken in the step before it.

A synchronous step launches its forward and sampler, reads the emitted tokens (the step's one
device-to-host copy), then appends them on the host: stop checks, detokenization, metrics, outputs.
On a GPU or an NPU the device is idle during that host work. With ``async_scheduling``, each engine
step instead

1. *launches* step n+1, its query tokens gathered on the device from step n's emitted tokens and its
   RNG counters and lengths one further than step n's, on the device too where its graphs read lengths
   from the device (``spec_ahead.launch_ahead``: no copy from the host while the slots stay as they
   were), and starts the copy of its tokens to the host (``Backend.start_host_copy``);
2. *reads* step n's tokens, the step's one synchronisation, where the backend's read waits for step n
   alone (``Backend.reads_early``: step n, launched at the engine step before, ran while the host
   prepared n+1); else step n was read at the end of the engine step before;
3. *lands* step n on the host while the device runs step n+1 (without early reads, n+1 is read then).

Plain steps (no drafts) are launched ahead where the engine drafts nothing, whatever step n's tokens
(no drafter; or one that takes its tokens at its next call, ``Drafter.defers_follow``, with speculation
off for the batch or adaptive drafting holding plain decoding past step n's draft-next,
``holds_past_next``), and no request reads host state in its sampling or its output that step n
changes: no penalties, biases, min-p, allowed tokens or grammars
(``SamplingParams.processes_logits``), no logprobs (the forward's logits buffer is the next replay's).
So are verify steps whose drafter drafts from step n's tokens on the device (``spec_ahead.py``: its
conditions there); a flight of one kind lands before a step of the other starts.
A request that ends at step n (a stop token, a stop string, ``max_tokens``, ``max_model_len``, an
abort) drops its step n+1 token (that step wrote the position of step n's token, at most
``max_model_len - 1``: within its slot). Before admitting new requests, and when the batch stops
qualifying, the engine lands the flight first (*drains*). Tokens are the synchronous engine's, token
for token. A request admitted after the flight lands joins a step later than the synchronous engine
admits it: plain decoding's tokens do not depend on the batch, nor do greedy
tokens on the drafts; with a drafter and a sampled request running or waiting, no step goes ahead while
requests wait, so admissions, and with them the batch sizes that turn speculation on and off and the
positions at which sampled requests verify drafts, are the synchronous engine's. A request ending at
the step in flight ends adaptive drafting's hold one decision later (the step after it was launched
plain: greedy tokens do not depend on the draft length).

Glossary: *launch* — the step's forward and sampler issued to the device; *land* — its tokens appended
to the requests on the host (``Stepper.land``); *flight* — the launched step not yet landed.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from spec_backend.engine.spec_ahead import captured_kind, room_ahead
from spec_backend.engine.stepper import StepEngine
from spec_backend.runtime.captured import step_graph

if TYPE_CHECKING:
    from spec_backend.engine.adaptive import AdaptiveDraftLength
    from spec_backend.engine.confidence import ConfidenceVerification
    from spec_backend.engine.request import Request
    from spec_backend.engine.step_result import Launched
    from spec_backend.engine.stepper import Stepper


class LookaheadEngine(StepEngine, Protocol):
    """What async scheduling reads of the engine (``EngineCore``) beyond a step's collaborators."""

    stepper: Stepper
    waiting: deque[Request]
    k: int

    @property
    def next_draft_length(self) -> int: ...

    adaptive: AdaptiveDraftLength | None
    confidence: ConfidenceVerification | None


logger = logging.getLogger(__name__)

#: speculative steps launched ahead, with adaptive drafting on, before one synchronous step is timed and
#: the draft length chosen again (``AdaptiveDraftLength.choose``: its costs and choices come from steps
#: it times; the acceptances it reads are counted on every landed step)
AHEAD_PER_DECISION = 8


class Lookahead:
    """The engine's step launched ahead (module docstring); ``flight`` is the step not landed yet."""

    def __init__(self, engine: LookaheadEngine) -> None:
        self.engine = engine
        self.flight: Launched | None = None
        self.speculative_launches = 0  # verify steps launched from a flight's device output
        #: speculative launches since adaptive drafting last chose (``AHEAD_PER_DECISION``), and whether
        #: the next decode step is synchronous so that it times one and chooses again
        self._since_decision, self._decide = 0, engine.adaptive is not None
        self.launches_ahead = 0  # steps launched while another was in flight (plain or speculative)

    def speculates(self) -> bool:
        """Whether the engine's next decode steps verify drafts found from a flight's tokens on the device
        (``spec_ahead.py``): a drafter that drafts ahead from its requests' tokens alone, speculation on,
        no per-step policy but adaptive drafting's last choice of K drafts (no confidence scheduling, no
        token tree), a captured verify step and sampler over lengths read from the device, and a cache that
        rolls back by its lengths alone (no sliding-window rings, no recurrent state)."""
        engine, drafter = self.engine, self.engine.drafter
        captured = engine.captured
        if drafter is None or not drafter.drafts_ahead:
            return False
        if captured is None or captured.verify is None or not captured.device_lengths:
            return False
        adapts = engine.adaptive is not None and engine.next_draft_length != engine.k
        policy = adapts or engine.confidence is not None or engine.tree is not None
        cache = engine.runner.cache
        return not (policy or engine.speculation_disabled or cache.recurrent_layers or cache.window_layers)

    def plain(self, requests: list[Request]) -> bool:
        """Whether the decode step after the next one drafts nothing, whatever the next one's tokens: no
        drafter; or one that is handed its tokens later (``Drafter.defers_follow``) and speculation off
        for the batch, or a hold of adaptive drafting that lasts past the next step's draft-next
        (``holds_past_next``)."""
        engine, drafter = self.engine, self.engine.drafter
        if drafter is None:
            return True
        if not drafter.defers_follow or engine.tree is not None or engine.confidence is not None:
            return False
        return engine.speculation_disabled or holds_past_next(engine.adaptive, requests)

    def can_launch(self, requests: list[Request]) -> bool:
        """Whether a step of ``requests`` can be launched, a step in flight or not. A verify step
        (``speculates``): every budget K whatever the step in flight emits (``max_tokens`` aside: cut on
        the device), at most ``AHEAD_PER_DECISION`` between adaptive drafting's choices. Else a
        one-token step: no drafts wait
        (``PendingDrafts``; a draft-next before speculation went off stored them), and the step replays
        no verify graph padded with placeholders. Either: no request waits while a drafter may draft for
        a sampled request (admissions keep the synchronous engine's steps), and each request samples
        from its logits alone (a request that ends at the step in flight drops the next step's token:
        ``max_tokens`` and ``max_model_len`` as a stop token)."""
        engine = self.engine
        speculative = self.speculates()
        if self.flight is not None and self.flight.speculative != speculative:
            return False  # a flight of the other kind lands first
        if speculative:
            if not room_ahead(requests, engine.k, engine.max_model_len):
                return False  # the step in flight may end a request, or near max_model_len
            if engine.drafter is not None and not engine.drafter.ready_ahead(requests):
                return False  # e.g. a draft model after a draft-next with speculation off (review)
            if engine.adaptive is not None and self._since_decision >= AHEAD_PER_DECISION:
                self._decide = True  # adaptive drafting times a synchronous step and chooses again
            if self._decide:
                return False
        else:
            graph = step_graph(engine.captured, engine.captured_plain, len(requests), False)
            if not self.plain(requests) or engine.pending.total or (graph is not None and graph.q != 1):
                return False  # drafts of an earlier draft-next, or a padded verify graph: K+1 positions
        if engine.drafter is not None and engine.waiting and _sampled(requests, engine.waiting):
            return False  # a request ending at the step in flight would admit one a step late: the
            # batch sizes that turn speculation on and off, and so the positions at which sampled
            # requests verify drafts (their tokens), would move (greedy tokens do not depend on them)
        alone = all(
            not r.finished and not r.params.processes_logits and r.params.logprobs is None for r in requests
        )
        return alone and (not speculative or self._captured_kind(requests))

    def _captured_kind(self, requests: list[Request]) -> bool:
        """Whether the verify step's captured sampler has a graph kind for ``requests`` (no top-k or top-p,
        no grammar)."""
        if any(r.grammar is not None for r in requests):
            return False
        return captured_kind(self.engine, self.engine.captured, len(requests)) is not None

    def ready(self, requests: list[Request]) -> bool:
        """Whether the next decode step of ``requests`` goes ahead (``step``): a step is in flight (the
        engine drained it otherwise, ``drains``), or one can start."""
        return self.flight is not None or self.can_launch(requests)

    def step(self, requests: list[Request]) -> None:
        """One decode step of ``requests`` (``ready``): launch the next step and land the flight while it
        runs, or start a flight."""
        if self.flight is not None:
            self._advance(requests)
            return
        # a failure: the synchronous step finds which request fails, and ends that one alone
        self.flight = self._launch(requests, None, "stepping synchronously", self.speculates())
        if self.flight is None:
            self.engine.stepper.decode(requests)

    def _launch(
        self, requests: list[Request], ahead: Launched | None, fallback: str, speculative: bool
    ) -> Launched | None:
        """``Stepper.launch`` (read at once without a step in flight); ``None`` if it raised, the cache's
        host lengths and the drafts waiting as they were (the failure logged, and what follows:
        ``fallback``)."""
        lengths, pending = self.engine.runner.cache.lengths, self.engine.pending
        saved, held = list(lengths), pending.counts(0, len(requests))
        try:
            launched = self.engine.stepper.launch(requests, ahead, speculative)
            self.launches_ahead += int(ahead is not None)
            self.speculative_launches += int(speculative and ahead is not None)
            self._since_decision += int(speculative and ahead is not None)
            return launched if ahead is not None else launched.read()
        except Exception:
            lengths[: len(saved)] = saved
            pending.restore(0, held)  # the drafts a launch from the synchronous state took (review)
            logger.error("a step launched ahead failed: %s", fallback, exc_info=True)
            return None

    def _advance(self, requests: list[Request]) -> None:
        flight, stepper = self.flight, self.engine.stepper
        assert flight is not None
        # a failure: land the flight; the next engine step starts over (synchronous there)
        launched = self._launch(requests, flight, "landing the one before it", flight.speculative)
        if launched is None:
            self.drain()
            return
        self.flight = None
        if self.engine.host_copy is not None:  # reads early: ``flight`` alone, ``launched`` queued behind
            landing = _read(flight)
            if landing is not None:
                self.flight = launched  # read at the next engine step, once the one after it is queued
                stepper.land(landing, True)  # the host's work, while the device runs ``launched``
        else:  # a read waits for all queued work: ``flight`` was read at the engine step before
            stepper.land(flight, True)  # the host's work, while the device runs ``launched``
            self.flight = _read(launched)

    def drains(self, requests: list[Request], admitting: bool) -> bool:
        """Land the flight where the next step cannot be launched ahead of it: requests are admitted
        (a prefill starts from every token landed), or the batch no longer qualifies (``can_launch``).
        Whether it landed one."""
        if admitting:  # a new batch: adaptive drafting chooses for it at a synchronous step first
            self._since_decision, self._decide = 0, self.engine.adaptive is not None
        elif self.flight is None:  # the step before was synchronous: adaptive drafting chose again
            self._since_decision, self._decide = 0, False
        if self.flight is None or not (admitting or not self.can_launch(requests)):
            return False
        self.drain()
        return True

    def drain(self) -> None:
        """Land the flight, if any: afterwards every request holds all its tokens, the cache every
        position but the newest (the synchronous engine's state between steps)."""
        flight, self.flight = self.flight, None
        if flight is not None:
            self.engine.stepper.land(flight, False)

    def clear(self) -> None:
        """Forget the flight (its requests were ended)."""
        self.flight = None


def _read(launched: Launched) -> Launched | None:
    """``launched`` with its tokens on the host; ``None`` (its requests failed) if the device failed it."""
    try:
        return launched.read()
    except Exception as exc:  # the device failed the step: its requests cannot go on
        for request in launched.requests:
            if not request.finished:
                request.fail(f"step failed: {type(exc).__name__}: {exc}")
        return None


def _sampled(*groups: Iterable[Request]) -> bool:
    return any(r.temperature > 0 for group in groups for r in group)


def holds_past_next(adaptive: AdaptiveDraftLength | None, requests: list[Request]) -> bool:
    """Whether adaptive drafting's hold (``AdaptiveDraftLength.held``) holds the next draft-next of
    ``requests`` whatever their next tokens: it lasts past it, was set for these requests, and no shadow
    is open (its outcome could end it). A request that ends at the next step ends the hold instead
    (``Stepper.land`` then decides nothing: the step after it was launched plain). Reads only."""
    if adaptive is None or adaptive.steps + 1 >= adaptive.hold_until or adaptive.shadows.open:
        return False
    ids = adaptive.hold_ids
    return len(ids) == len(requests) and all(
        not r.finished and r.request_id == i for r, i in zip(requests, ids, strict=True)
    )


__all__ = ["AHEAD_PER_DECISION", "Lookahead", "holds_past_next"]
