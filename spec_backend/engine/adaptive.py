"""Adaptive draft length: how many drafts greedy requests get each step, chosen by measured cost.

Speculation pays when the tokens a step emits grow faster than its time. Each step this module picks the
draft length ``k`` in ``0..K`` that maximises ``sum_i E_i(k) / C(B, k)`` over the greedy requests ``i`` of a
batch of ``B``: the tokens a step emits over its cost, in plain steps.

* **Acceptance.** ``a_i`` is the request's own acceptance so far (accepted / drafted), pulled towards the
  engine's running mean by ``PRIOR_DRAFTS`` pseudo-drafts, so a new request starts at the engine's mean.
  While plain decoding is chosen nothing is verified, so a host drafter is still asked now and then and its
  drafts are checked against the tokens the request then emits (``shadow_drafts``): a greedy request's
  tokens do not depend on its drafts, so that count is what a verify step would have found.
* **Reach.** A drafter may propose fewer drafts than its budget (suffix and n-gram drafters often none on
  open chat). ``R_j(B)`` is the share of requests whose drafter proposed at least ``j`` drafts (a moving
  average per ``j``, from verify steps whose budget reached ``j`` and from shadows), and
  ``E_i(k) = sum_{j=0..k} a_i^j R_j`` (``R_0 = 1``). The mean number of drafts alone would not do: two
  drafts in a quarter of the steps are worth ``1 + (a + a^2) / 4``, far less than half a draft in every
  step, ``(1 - a^1.5) / (1 - a)``, at a small ``a``.
* **Cost.** What a step costs depends on the drafts it verifies, not on its budget: an eager step computes
  one row per query token, so ``C(B, k) = 1 + s(B) * sum_{j<=k} R_j`` with ``s`` the extra time of one
  draft row per request; on an engine whose verify step is a captured graph of K+1 rows per request
  (``fixed_width``) any step with a draft replays it and one without replays the one-token step, so
  ``C(B, k) = 1 + s(B) * (1 - (1 - R_1)^B)`` with ``s`` the verify graph's extra. ``s`` is measured
  **against plain steps of the same moment**: a step that verified ``x > 0`` drafts and took ``t``
  against ``t_0``, the plain steps' time over the last ``REFERENCE_AGE`` steps (every step verifying no
  draft is one), gives ``(t / t_0 - 1) * B / x`` (flat: ``t / t_0 - 1``), and ``s`` is their moving
  average; a step with no plain step that recent is no sample. Absolute times would not do: a decode
  step's time grows with the context (on the AVX2 demo from 6.3 ms at a short prompt to 11-12 ms at a
  code edit's) and drifts with the load, so lengths timed during different prompts compared prompts
  (plain decoding once measured 18 ms during code edits against 11 ms for one draft during chat, and one
  draft was chosen where it verified almost none).
* **Measuring.** An engine profiles ``s(B)`` when it starts (``cost_profile.py``: its forward timed at one and
  at ``K + 1`` rows per request), and a batch size starts from that profile: no step verifies drafts only to
  time them. Without a profile, plain decoding is measured first, then ``K`` until its drafts have been timed
  — with a drafter that shadows, only once shadows have decided drafts and the acceptances and reach say
  drafting would pay were draft rows free (on open chat it may never be: each verify step timing ``K`` drafts
  cost ~1.5 plain steps for nothing on the AVX2 demo machine, a fresh engine ~0.6 % of a 96-token chat reply);
  now and then the extreme not chosen is measured again for ``EXPLORE_HOLD`` steps, so a change of load is
  noticed (and, while drafting is chosen, plain decoding is timed anew): first after ``EXPLORE_EVERY`` steps,
  then twice as long after each re-measurement that left the choice as it was (up to ``EXPLORE_MAX``), and
  ``EXPLORE_EVERY`` again after one that changed it (one during which the batch size changed leaves the period
  as it was). On open chat, where drafts rarely pay, a fixed period spent 3 steps in 32 verifying K drafts for
  nothing (~5 % of the time); and no re-measurement starts from plain decoding while the acceptance (which
  shadows keep measured) says drafting would not pay even if draft rows cost nothing: its cost could not
  change the choice.
* **Holding.** Once plain decoding is chosen by the measured rates, the steps up to the next one that must
  decide (a shadow due, the next re-measurement, a change of batch) are held (``hold``, ``held``): they
  choose plain decoding without deciding, and the engine skips the drafter for them when it
  ``defers_follow`` (``EngineCore.holds_plain``), so on open chat most steps cost what a plain step does
  (before, every step paid the decision, the drafter's bookkeeping and the step's draft inputs: 1-2 % of a
  SmolLM2 step on a 2-core VM). Held steps choose what deciding would: nothing the choice reads changes
  while nothing is drafted or verified except shadows' outcomes, and a shadow that accepts nothing only
  lowers the acceptances (one that accepts ends the hold).
* Drafting must be predicted to beat plain decoding by ``MARGIN`` (5 %) to be chosen: the costs are
  moving averages of single steps, on machines whose step times vary by more than that from one step to
  the next, and a draft length chosen on noise loses what plain decoding would have kept.

Only **greedy** requests adapt: their output is the target's argmax whatever is drafted, so the choice
cannot change it. Sampled requests keep ``K``: which drafts are verified changes which random numbers a
seeded request uses, and a time-based choice would make its tokens depend on the machine's load.

Glossary: *draft length* — drafts budgeted to a request for one step (``k``; the drafter may propose fewer);
*plain step* — a decode step that verified no draft, the unit costs are measured in; *draft row* — a
query row a verify step adds for one draft.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from spec_backend.engine.shadow_drafts import SHADOW_MAX, ShadowDrafts, ShadowRequest

#: pseudo-drafts at the engine's mean acceptance added to each request's own counts
PRIOR_DRAFTS = 8
#: steps between two measurements of the extreme not chosen
EXPLORE_EVERY = 32
#: the longest period between two re-measurements (module docstring)
EXPLORE_MAX = 1024
#: how much faster than plain decoding (k = 0) drafting must be predicted to be before it is chosen
MARGIN = 1.05
#: weight of a new measurement in the moving averages
EMA_WEIGHT = 0.25
#: measurements (plain steps, drafting steps) before they are trusted
MIN_SAMPLES = 2
#: steps after a plain step during which a drafting step's time is compared with it (module docstring)
REFERENCE_AGE = 8
#: weight of a new plain step in the reference (recent plain steps count: the context and the load drift)
REFERENCE_WEIGHT = 0.5
#: a step never reached
NEVER = 2**62
#: consecutive steps one re-measurement lasts: the drafts of the step that switches are verified by the
#: next one, so a one-step exploration timed nothing
EXPLORE_HOLD = MIN_SAMPLES + 1
#: the most recent choices ``chosen`` keeps (between this and twice it): an engine serving for days takes
#: a step every few milliseconds, and a list of every choice would grow without end
CHOSEN_KEPT = 4096


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a step emits on average with ``k`` drafts each accepted with probability ``acceptance``
    (exactly ``k`` every step; ``reached_tokens`` when the number of drafts varies). The closed form."""
    a = min(max(acceptance, 0.0), 1.0)
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def reached_tokens(acceptance: float, reach: Sequence[float]) -> list[float]:
    """``[len(reach) + 1]``: the tokens a step emits on average with draft length ``k`` (entry ``k``)
    when ``reach[j - 1]`` of the requests are proposed at least ``j`` drafts, each accepted with
    probability ``acceptance``: ``E(k) = 1 + sum_{j<=k} acceptance^j reach[j - 1]``."""
    a = min(max(acceptance, 0.0), 1.0)
    tokens, power = [1.0], 1.0
    for share in reach:
        power *= a
        tokens.append(tokens[-1] + power * share)
    return tokens


def reach_of(drafts: Sequence[int], k: int) -> list[float]:
    """``[k]``: the share of requests whose drafts (``drafts``, one count per request) reach 1..k."""
    n = max(len(drafts), 1)
    return [sum(1 for d in drafts if d >= j) / n for j in range(1, k + 1)]


def interpolated(profile: Mapping[int, float], batch: int) -> float:
    """``s(batch)`` from a profile: linear between the two profiled sizes around it, the nearest end's
    outside them."""
    sizes = sorted(profile)
    if not sizes:
        raise ValueError("an empty profile has no slope")
    if batch <= sizes[0]:
        return profile[sizes[0]]
    if batch >= sizes[-1]:
        return profile[sizes[-1]]
    hi = bisect.bisect_left(sizes, batch)
    lo_size, hi_size = sizes[hi - 1], sizes[hi]
    share = (batch - lo_size) / (hi_size - lo_size)
    return profile[lo_size] + share * (profile[hi_size] - profile[lo_size])


@dataclass
class _Batch:
    """What is measured at one batch size (module docstring)."""

    reach: list[float]  # [K] R_j: share of requests proposed at least j drafts (moving averages)
    reached: list[int]  # [K] samples of each R_j
    slope: float = (
        0.0  # s: extra time of a draft row per request (fixed_width: of a verify step), plain steps
    )
    samples: int = 0  # drafting steps timed against a recent plain step
    sample_step: int = -(2**62)  # the step that timed drafting last
    plain: int = 0  # plain steps timed
    reference: float = 0.0  # a plain step's time now (moving average over recent plain steps)
    reference_step: int = -(2**62)  # the step that timed it last

    def add_reach(self, drafts: Sequence[int], k: int) -> None:
        """Requests were proposed ``drafts`` drafts (one count each) under a budget of ``k``: R_1..R_k."""
        for j, share in enumerate(reach_of(drafts, k)):
            old = self.reach[j]
            self.reach[j] = old + EMA_WEIGHT * (share - old) if self.reached[j] else share
            self.reached[j] += 1


@dataclass
class AdaptiveDraftLength:
    """The draft-length policy of one engine (module docstring)."""

    k: int
    batches: dict[int, _Batch] = field(default_factory=dict)  # batch size -> its measurements
    drafted: int = 0  # every verified (or shadow) draft so far
    accepted: int = 0
    steps: int = 0
    #: the k of each step that adapted, the most recent ``CHOSEN_KEPT`` at least (for tests, logs)
    chosen: list[int] = field(default_factory=list)
    period: int = EXPLORE_EVERY  # steps from the end of one re-measurement to the start of the next
    next_explore: int = EXPLORE_EVERY  # the step at which the next re-measurement starts
    explored_from: int | None = None  # during a re-measurement: the choice it started from
    explore_end: int = 0  # during a re-measurement: its first step after it
    explored_batch: int = 0  # during a re-measurement: the batch size it started at
    fixed_width: bool = False  # every step with drafts replays a K+1-rows-per-request graph
    clock: Callable[[], float] = time.perf_counter  # what a step's time is read from (tests pass their own)
    #: drafts proposed and not verified, checked against the tokens that follow (shadow_drafts)
    shadows: ShadowDrafts = field(default_factory=ShadowDrafts)
    last_shadow: int = -(2**62)  # the step that recorded shadows last
    #: after a choice of plain decoding that only shadows can change (``hold``): the step until which no
    #: re-measurement is due (``None``: the last choice was another)
    settled: int | None = None
    hold_until: int = 0  # held steps (``hold``) last while ``steps + 1`` is below it
    hold_ids: tuple[str, ...] = ()  # the requests the hold was set for
    held_steps: int = 0  # steps held so far (for benchmarks and logs)
    #: whether the drafter shadows (``Drafter.can_shadow``): then drafting is first timed only once the
    #: shadows' acceptance says it could pay (module docstring)
    shadowed: bool = False
    #: batch size -> ``s(B)`` timed when the engine started (``cost_profile``): a batch size first met
    #: starts from it, its drafting already timed (empty: measured online first, as the docstring says)
    profile: dict[int, float] = field(default_factory=dict)

    @property
    def mean_acceptance(self) -> float:
        return (self.accepted + 1) / (self.drafted + 2)  # Laplace: 0.5 before any draft

    def acceptance_of(self, drafted: int, accepted: int, request_id: str | None = None) -> float:
        """A request's acceptance estimate from its own counts (and its resolved shadows') and the
        engine's mean."""
        shadow_drafted, shadow_accepted = self.shadows.counts_of(request_id) if request_id else (0, 0)
        drafted, accepted = drafted + shadow_drafted, accepted + shadow_accepted
        return (accepted + PRIOR_DRAFTS * self.mean_acceptance) / (drafted + PRIOR_DRAFTS)

    def batch(self, batch: int) -> _Batch:
        """The measurements at ``batch`` requests (empty at first)."""
        found = self.batches.get(batch)
        if found is None:
            found = self.batches[batch] = _Batch([0.0] * self.k, [0] * self.k)
            # drafting already timed; a drafter that cannot shadow is taken to fill its budget until a
            # verify step says otherwise (its reach is learnt only from those)
            if self.profile and batch <= max(self.profile):
                found.slope, found.samples = interpolated(self.profile, batch), MIN_SAMPLES
                found.reach = [0.0 if self.shadowed else 1.0] * self.k
        return found

    def choose(self, batch: int, acceptances: Sequence[float], mixed: bool = False) -> int:
        """The draft length of the next step for a batch of ``batch`` requests, ``acceptances`` those of
        its greedy requests (empty: nothing adapts, ``K``). ``mixed``: the batch also holds a sampled
        request, whose drafts are verified every step, so none of its steps is a plain step to time
        drafting against: everyone keeps ``K`` (before, its greedy requests were held at 0 for good)."""
        self.steps += 1
        self.settled = None
        if not acceptances or mixed or self.k == 0:
            return self.k
        measured = self.batch(batch)
        tokens = self.tokens(batch, acceptances)
        unseen = not self.drafted or max(tokens) < MARGIN * tokens[0]  # no draft decided yet, or they
        if measured.samples < MIN_SAMPLES and self.shadowed and unseen:  # would not pay even at no cost
            self.settled = NEVER  # not worth timing (yet): shadows will tell
            return self._chose(0)
        fresh = self.steps - measured.reference_step <= REFERENCE_AGE
        if measured.plain < MIN_SAMPLES or (measured.samples < MIN_SAMPLES and not fresh):
            return self._chose(0)  # plain decoding first: drafting is timed against it
        if measured.samples < MIN_SAMPLES:
            return self._chose(self.k)
        rates = [t / self.cost(batch, k) for k, t in enumerate(tokens)]
        best = max(range(self.k + 1), key=rates.__getitem__)
        if rates[best] < MARGIN * rates[0]:
            best = 0  # a predicted gain inside the noise of the measurements
        free = max(tokens) >= MARGIN * tokens[0]  # whether drafting would pay were draft rows free
        chosen = self._explored(batch, best, free)
        self.settled = self.next_explore if not chosen and self.explored_from is None else None
        return self._chose(chosen)

    def hold(self, requests: Sequence[ShadowRequest], shadowed: bool) -> None:
        """After ``choose``: where it chose plain decoding by the measured rates, the steps up to the next one
        that must decide are *held* (``held``), so the engine can skip the policy and the drafter for them
        (``EngineCore.holds_plain``). Held steps choose what ``choose`` would: while nothing is drafted or
        verified, the costs stay as they are, and the acceptances move only with shadows; a shadow that
        accepts nothing only lowers them (every draft length's expected tokens fall, plain decoding's stay),
        and one that accepts ends the hold. It lasts until the next re-measurement (none is due while drafting
        waits for shadows before it is first timed) and, when the drafter shadows (``shadowed``), the first
        step at which one of ``requests`` (the whole batch: every request greedy and unfinished) is due a
        shadow; a change of batch ends it (``end_hold``)."""
        self.hold_until = 0
        if self.settled is None:
            return
        until = self.settled
        if shadowed:
            for request in requests:
                due = self.shadows.due_step(request.request_id)
                if due is None:
                    return  # due now
                until = min(until, due)
        self.hold_until, self.hold_ids = until, tuple(r.request_id for r in requests)

    def held(self, requests: Sequence[ShadowRequest]) -> bool:
        """Whether the next step of ``requests`` is held (``hold``): then it counts as a step that chose
        plain decoding, and its shadows' outcomes are counted as ``choose`` would count them."""
        if self.steps + 1 >= self.hold_until or len(requests) != len(self.hold_ids):
            return False
        for request, held_id in zip(requests, self.hold_ids, strict=True):
            if request.finished or request.request_id != held_id:  # finished ones leave after this step,
                return False  # or another batch (a request retried alone)
        if self.shadows.open and self.resolve_shadows(requests):  # the acceptances rose: decide
            self.hold_until = 0
            return False
        self.steps += 1
        self.held_steps += 1
        self._chose(0)
        return True

    def end_hold(self) -> None:
        """The batch changed: the next step decides."""
        self.hold_until = 0

    def _explored(self, batch: int, best: int, free: bool) -> int:
        """``best``, or the extreme not chosen during a re-measurement (module docstring); none from plain
        decoding while drafting would not pay even at no cost (``free`` false) by acceptances that
        shadows keep measured: measuring its cost again could not change the choice, and it verifies K
        drafts for nothing. Without recent shadows (a drafter that cannot shadow) the acceptance stands
        still while nothing is verified, and only a re-measurement can see it change. One whose extreme was
        timed within the period (drafting timed because shadows said it could pay, or plain steps where the
        drafter found nothing) is put off to a period after that timing: it would learn nothing new."""
        if self.explored_from is None and self.steps >= self.next_explore:
            measured = self.batch(batch)
            timed = measured.reference_step if best else measured.sample_step  # the extreme not chosen
            if self.steps - timed < self.period:  # timed within the period: put off until a period after
                self.next_explore = timed + self.period
                return best
            if not best and not free and self.steps - self.last_shadow <= 2 * SHADOW_MAX:
                self.period = min(2 * self.period, EXPLORE_MAX)
                self.next_explore = self.steps + self.period
                return best
            self.explored_from, self.explore_end = best, self.steps + EXPLORE_HOLD
            self.explored_batch = batch
        if self.explored_from is None:
            return best
        if self.steps < self.explore_end:
            return 0 if self.explored_from else self.k
        if batch == self.explored_batch:  # else the two choices are of different batch sizes
            same = best == self.explored_from
            self.period = min(2 * self.period, EXPLORE_MAX) if same else EXPLORE_EVERY
        self.next_explore, self.explored_from = self.steps + self.period, None
        return best

    def rate(self, batch: int, k: int, acceptances: Sequence[float]) -> float:
        """Expected tokens of the greedy requests per plain step's time with draft length ``k``."""
        return self.rates(batch, acceptances)[k]

    def rates(self, batch: int, acceptances: Sequence[float]) -> list[float]:
        """``[K + 1]``: ``rate`` of every draft length."""
        return [t / self.cost(batch, k) for k, t in enumerate(self.tokens(batch, acceptances))]

    def tokens(self, batch: int, acceptances: Sequence[float]) -> list[float]:
        """``[K + 1]``: ``sum_i E_i(k)`` of every draft length (``reached_tokens`` per request)."""
        reach = self.batch(batch).reach
        per_request = [reached_tokens(a, reach) for a in acceptances]  # [requests][K + 1]
        return [sum(column) for column in zip(*per_request, strict=True)] or [0.0] * (self.k + 1)

    def cost(self, batch: int, k: int) -> float:
        """``C(B, k)``: a step's expected time with draft length ``k``, in plain steps (module docstring)."""
        measured = self.batch(batch)
        if k == 0:
            return 1.0
        slope = max(measured.slope, 0.0)  # a draft row costs something: a faster step was noise
        if self.fixed_width:
            return 1.0 + slope * (1.0 - (1.0 - measured.reach[0]) ** batch)
        return 1.0 + slope * sum(measured.reach[:k])

    def observe(self, batch: int, k: int, seconds: float, drafts: Sequence[int], accepted: int) -> None:
        """A decode step of ``batch`` requests that verified ``drafts`` drafts (one count per request,
        under draft length ``k``) and accepted ``accepted`` in all took ``seconds``."""
        rows = sum(drafts)
        self.drafted += rows
        self.accepted += accepted
        measured = self.batch(batch)
        if k:  # a budget of 0 reaches nothing
            measured.add_reach(drafts, k)
        fresh = self.steps - measured.reference_step <= REFERENCE_AGE
        if not rows:  # a plain step: the reference
            now = measured.reference if fresh else seconds
            measured.reference = now + REFERENCE_WEIGHT * (seconds - now)
            measured.reference_step, measured.plain = self.steps, measured.plain + 1
            return
        if not fresh or measured.reference <= 0.0:
            return  # too long after a plain step to compare with it (module docstring)
        extra = seconds / measured.reference - 1.0
        slope = extra if self.fixed_width else extra * batch / rows
        measured.slope = measured.slope + EMA_WEIGHT * (slope - measured.slope) if measured.samples else slope
        measured.samples, measured.sample_step = measured.samples + 1, self.steps

    def resolve_shadows(self, requests: Sequence[ShadowRequest]) -> int:
        """Count the shadows of ``requests`` that their tokens since decide (``shadow_drafts``); the drafts
        they accepted."""
        drafted, accepted = self.shadows.resolve(requests)
        self.drafted += drafted
        self.accepted += accepted
        return accepted

    def observe_shadows(
        self, batch: int, requests: Sequence[ShadowRequest], drafts: Sequence[Sequence[int]]
    ) -> None:
        """A step of ``batch`` requests drafted ``drafts`` for ``requests`` (their budgets were 0) without
        verifying them: kept as shadows, and their numbers are how far a budget of ``K`` reaches."""
        for request, draft in zip(requests, drafts, strict=True):
            self.shadows.record(request, draft, self.steps)
        self.last_shadow = self.steps
        if requests:
            self.batch(batch).add_reach([len(d) for d in drafts], self.k)

    def _chose(self, k: int) -> int:
        self.chosen.append(k)
        if len(self.chosen) > 2 * CHOSEN_KEPT:  # trimmed in halves: amortised O(1) a step
            del self.chosen[:-CHOSEN_KEPT]
        return k


__all__ = ["AdaptiveDraftLength", "expected_tokens", "interpolated", "reach_of", "reached_tokens"]
