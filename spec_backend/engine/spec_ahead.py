"""Steps launched ahead from the device: a verify step launched before the host lands the step before
it, its drafts found on the device from that step's tokens (``Drafter.propose_ahead``: ``ngram_gpu``, a
draft model, an EAGLE-style head over that step's hidden states as well),
and a plain step (``lookahead.py``) whose one-token graph reads device lengths, by the same path without
drafts (nothing copied from the host: a copy from pageable memory would wait for the step in flight).

A synchronous speculative step reads its emitted tokens, appends them on the host, drafts the next step's
tokens and only then launches the next forward: on a GPU the device idles through all of that host work.
``lookahead.py`` launches *plain* steps ahead; this module does the same for speculative steps whose
drafter drafts from tokens still on the device. Launching step n+1 while step n is unread:

1. step n's packed output (``StepResult.packed``) gives each request's emitted tokens and their count;
   its last emitted token is step n+1's first query token (a gather on the device);
2. the drafter appends those tokens to its device state and drafts over them (``propose_ahead``): each
   request's draft rows, placeholders past its match, as the synchronous draft-next finds them;
3. the positions come from step n's RNG counters and counts on the device (``StepResult.counters``): a
   request with ``t`` tokens before step n (its counter there) and ``c`` emitted by it feeds its K+1 rows
   at positions ``t + c - 1 ..`` (its cache holds every token but the newest) and its RNG counter is
   ``t + c``, as the synchronous step n+1's (``Stepper._sampling``); nothing is copied from the host;
4. the verify step replays its graph over these device tensors (``CapturedDecode.forward_ahead``: the
   seq lens a device tensor, nothing read) and its sampler's graph, whose packed output is step n+1's.

The host's cache lengths hold an upper bound while steps are in flight (each launch reserves K+1 rows; a
landed step sets its requests' lengths to their tokens plus the step in flight's K+1 rows). A drained
step (no successor) truncates them to the synchronous state and runs the draft-next, whose drafts the next
synchronous step verifies.

Steps go ahead only where the next step's drafts equal the synchronous engine's, so the tokens do too
(greedy and seeded sampled; a draft model's up to a near-tie in low precision, ``draft_model_ahead``):
the drafter's state is its requests' tokens (``defers_follow``) or a draft model's fed drafts, ready for
it (``Drafter.ready_ahead``), every request's draft budget is K whatever step n emits but for
``max_tokens``, whose cut is made on the device from step n's counts (``room_ahead``,
``within_budgets``), no confidence scheduling or token tree chooses per step, and the backend's captured
attention reads the lengths from the device (``Backend.captures_draft_chains``). With adaptive drafting,
steps go ahead while its last choice drafts K, ``AHEAD_PER_DECISION`` at a time between choices made at
synchronous steps it times, and a new batch is chosen for first (``lookahead.py``): greedy tokens do not
depend on the draft length, and a sampled request always drafts K. Everything else ``lookahead.py``
requires of a step launched ahead (no logprobs, no logits processors, a captured sampler kind,
admissions) holds too.

Glossary: *landed* — a step's tokens appended to its requests on the host; *flight* — the launched step
not landed yet (``lookahead.py``); *ahead* — drafted or launched from a flight's device output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from spec_backend.engine.step_result import Launched, StepResult, moved_rows, request_rows
from spec_backend.proposers.contract import FlightTokens
from spec_backend.runtime.captured import step_graph
from spec_backend.runtime.captured_verify import verify_kind_of
from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID

if TYPE_CHECKING:
    from spec_backend.engine.request import Request
    from spec_backend.engine.sampling_state import SamplingState
    from spec_backend.proposers.contract import Drafter
    from spec_backend.runtime.captured import CapturedDecode
    from spec_backend.runtime.captured_verify import CapturedVerify
    from spec_backend.runtime.runner import ModelRunner
    from spec_backend.runtime.slots import SlotTable


class AheadEngine(Protocol):
    """What a step launched ahead reads of the engine (``EngineCore``)."""

    runner: ModelRunner
    slots: SlotTable
    drafter: Drafter | None
    sampling_state: SamplingState
    captured: CapturedDecode | None
    captured_plain: CapturedDecode | None
    running: list[Request]


class AheadStepper(Protocol):
    """What landing a speculative flight calls of the stepper (``Stepper``)."""

    @property
    def engine(self) -> AheadEngine: ...

    def append_emitted(
        self, start: int, requests: list[Request], result: StepResult, last_only: bool, truncate: bool
    ) -> list[list[int]]: ...

    def draft_next(
        self, start: int, requests: list[Request], result: StepResult, last_only: bool, kept: list[list[int]]
    ) -> None: ...


def room_ahead(requests: list[Request], k: int, max_model_len: int) -> bool:
    """Whether the step after the next is worth launching now for every request whatever the next step
    emits (1 .. K+1 tokens): ``max_tokens`` cannot end the request at the next step (a step launched
    after it would be wasted) and its cache holds the step after, so its draft budget is K there but for
    ``max_tokens``, which ``launch_ahead`` applies on the device (``EngineCore._budget`` caps by both)."""
    q = k + 1
    return all(r.remaining > q and max_model_len - r.num_tokens >= 2 * q for r in requests)


def within_budgets(drafts: torch.Tensor, ends: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``drafts [B, K]`` cut to each request's budget as ``EngineCore._budget`` cuts it by ``max_tokens``
    (a step verifying ``b`` drafts emits up to ``b + 1`` tokens, and ``ends - after`` are left, ``after``
    the tokens after the step in flight): placeholders past it, which the sampler never accepts."""
    budget = (ends - after - 1).clamp(min=0)  # [B]
    columns = torch.ones_like(drafts).cumsum(dim=1) - 1  # [B, K] 0 .. K-1, made on the device
    return torch.where(columns < budget[:, None], drafts, torch.full_like(drafts, PLACEHOLDER_TOKEN_ID))


def flight_tokens(flight: Launched, requests: list[Request]) -> FlightTokens:
    """``flight``'s tokens on the device for ``requests`` (each one of the flight's): emitted ``[B, W]``
    (placeholders after them), their counts, each request's tokens before the step (its RNG counter), the
    step's first query token, and the target's hidden states of its ``W`` query rows where recorded."""
    result = flight.result
    packed, counters, fed = result.packed, result.counters, result.fed
    assert packed is not None and counters is not None and fed is not None
    width, launched = packed.shape[1] - 1, len(flight.requests)  # q rows per request
    final, aux = result.target.final, result.target.aux  # [N, H], [N, n_aux, H]: N >= launched * q
    final = None if final is None else final[: launched * width].view(launched, width, *final.shape[1:])
    aux = None if aux is None else aux[: launched * width].view(launched, width, *aux.shape[1:])
    index = moved_rows(flight.requests, requests)
    if index is not None:  # requests left since the launch: the rows of those still running
        rows = torch.tensor(index, dtype=torch.int64).to(packed.device)  # [B]
        packed, counters, fed = packed[rows], counters[rows], fed[rows]
        final, aux = (None if t is None else t[rows] for t in (final, aux))
    emitted = packed[:, :-1]  # [B, W]: the last column is the verified draft count
    return FlightTokens(emitted, (emitted != PLACEHOLDER_TOKEN_ID).sum(dim=1), counters, fed, final, aux)


def launch_ahead(
    engine: AheadEngine, requests: list[Request], flight: Launched, speculative: bool
) -> Launched | None:
    """Step n+1 of ``requests`` launched from ``flight`` (step n, unread): module docstring, 1-4; a plain
    step (not ``speculative``: no drafter drafts for it, ``lookahead.py``) feeds the token step n emitted.
    Nothing is copied from the host while the slots stay as they were. ``None`` for a plain step whose
    one-token graph is not captured over device lengths or has no sampler graph of its kind (it is then
    launched from host values, ``Stepper.launch``)."""
    found = _graphs(engine, len(requests), flight, speculative)
    if found is None:
        if speculative:
            raise ValueError("a verify step launched ahead needs its graphs over device lengths")
        return None
    captured, verify, kind = found
    q = captured.q
    tokens_n = flight_tokens(flight, requests)
    first = tokens_n.before + tokens_n.counts  # [B] each request's tokens after step n: its RNG counter
    sampling = engine.sampling_state.metadata(0, first)
    last = tokens_n.bonus[:, None]  # [B, 1]
    tokens = last
    if speculative:
        drafter = engine.drafter
        assert drafter is not None
        if drafter.defers_follow:  # none unseen while steps go ahead: handed over on landing
            unseen = [r.unseen_tokens() for r in requests]
            if any(unseen):
                _failed(requests, drafter.take_tokens(requests, unseen))
        drafts = drafter.propose_ahead(requests, tokens_n, [q - 1] * len(requests))  # [B, K]
        drafts = within_budgets(drafts, engine.sampling_state.ends[: len(requests)], first)
        tokens = torch.cat([last, drafts], dim=1)  # [B, K+1]
    batch, target = captured.forward_ahead(tokens.clamp_min(0).reshape(-1), first - 1 + q)
    packed = verify.launch(kind, target.logits, tokens, sampling)  # [B, q + 1]
    result = StepResult(batch, target, [], [], packed, True, first, last.squeeze(1))
    return Launched(list(requests), result, speculative)


def land_ahead(stepper: AheadStepper, launched: Launched, successor: bool) -> None:
    """A speculative flight's tokens appended (stop checks, metrics). ``successor``: the next step is in
    flight (launched from this one): each running request's cache length becomes its tokens plus that
    step's K+1 rows, and the drafter is handed the tokens (it drafted from them on the device already).
    Otherwise the synchronous state: lengths truncated to every token but the newest, then the
    draft-next, whose drafts the next synchronous step verifies."""
    engine = stepper.engine
    result, running = launched.result.read(), list(engine.running)
    kept = stepper.append_emitted(0, launched.requests, result, False, False)
    q = engine.captured.q if engine.captured is not None else 1
    for slot, request in enumerate(running):
        if not request.finished:
            engine.slots.truncate(slot, request.num_tokens - 1 + (q if successor else 0))
    drafter = engine.drafter
    if successor and drafter is not None:  # the drafter drafted after these tokens on the device
        live = [r for r in running if not r.finished]
        if drafter.defers_follow and live:
            _failed(live, drafter.take_tokens(live, [r.unseen_tokens() for r in live]))
        elif not drafter.defers_follow:
            drafter.landed_ahead([None if r.finished else r for r in running])
    if successor:
        return
    index = moved_rows(launched.requests, running)
    if index is not None:  # requests left since the launch: the draft-next sees the live ones' rows
        kept = [kept[i] for i in index]  # (a head reads their hidden states; review: it read slot b's)
        cached = [r.num_tokens - len(k) - 1 for r, k in zip(running, kept, strict=True)]
        result = request_rows(result, index, cached)
    if running:
        stepper.draft_next(0, running, result, False, kept)


def _graphs(
    engine: AheadEngine, batch: int, flight: Launched, speculative: bool
) -> tuple[CapturedDecode, CapturedVerify, str] | None:
    """The captured step a step launched ahead replays (the verify step, or the one-token step of a
    plain one), its sampler's graphs and their kind for the batch; ``None`` unless the step is captured
    over device lengths with a sampler graph of the batch's kind and ``flight`` counted its RNG counters
    on the device."""
    plain = step_graph(engine.captured, engine.captured_plain, batch, False)
    captured = engine.captured if speculative else plain
    kind = captured_kind(engine, captured, batch)
    if captured is None or captured.verify is None or kind is None:
        return None
    if (
        not captured.device_lengths
        or flight.result.counters is None
        or flight.result.fed is None
        or not (speculative or captured.q == 1)
    ):
        return None
    return captured, captured.verify, kind


def captured_kind(engine: AheadEngine, captured: CapturedDecode | None, batch: int) -> str | None:
    """The kind of ``captured``'s sampler graphs that verifies slots ``0 .. batch - 1`` (from the host's
    sampling flags: nothing built on the device); ``None``: none captured for them (top-k or top-p)."""
    if captured is None or captured.verify is None:
        return None
    kind = verify_kind_of(engine.sampling_state.flags(0, batch))
    return kind if kind in captured.verify.runners else None


def _failed(requests: list[Request], errors: tuple[str | None, ...]) -> None:
    for request, error in zip(requests, errors, strict=False):
        if error is not None and not request.finished:
            request.fail(error)


__all__ = [
    "AheadEngine",
    "AheadStepper",
    "captured_kind",
    "flight_tokens",
    "land_ahead",
    "launch_ahead",
    "room_ahead",
    "within_budgets",
]
