"""Adaptive draft length: how many drafts greedy requests get each step, chosen by measured cost.

Speculation pays when the tokens a step emits grow faster than its time. For a request whose drafts are
accepted with probability ``a`` each, ``k`` drafts emit ``E(k) = (1 - a^(k+1)) / (1 - a)`` tokens per step
on average; a step of ``B`` requests with ``k`` drafts each takes ``rho(B, k)`` times a plain step. Each
step this module picks the ``k`` in ``0..K`` that maximises ``sum_i E_i(k) / rho(B, k)``:

* ``a_i`` is the request's own acceptance so far (accepted / drafted), pulled towards the engine's
  running mean by ``PRIOR_DRAFTS`` pseudo-drafts, so a new request starts at the engine's mean;
* ``E_i(k)`` counts the drafts requests verified in the steps measured at ``k``, not ``k``: a drafter may
  propose fewer than its budget (suffix and n-gram drafters often propose none on open chat), and a
  budget whose drafts never come must not look as if it paid. What counts is how often a request reached
  each draft: with ``R_j(B, k)`` the share of requests that verified at least ``j`` drafts,
  ``E_i(k) = sum_{j=0..k} a_i^j R_j(B, k)`` (``R_0 = 1``). The mean number of drafts alone would not do:
  two drafts in a quarter of the steps are worth ``1 + (a + a^2) / 4``, far less than half a draft in
  every step, ``(1 - a^1.5) / (1 - a)``, at a small ``a``. Unmeasured lengths take ``R_j(B, K)`` for
  ``j <= k`` (a budget of ``k`` cuts the drafts a budget of ``K`` gets);
* a step's time is measured **against plain decoding's at the same moment**: ``rho(B, k)``, the time of a
  step of ``B`` requests that drafted ``k`` over that of the plain steps (``k = 0``) of the last
  ``REFERENCE_AGE`` steps, is a moving average of such ratios, and a step with no plain step that recent
  is no sample of it. Absolute times would not do: a decode step's time grows with the context (on the
  AVX2 demo from 6.3 ms at a short prompt to 11-12 ms at a code edit's) and drifts with the machine's
  load, so the times of two lengths measured during different prompts compared prompts, not lengths
  (plain decoding once measured 18 ms during code edits against 11 ms for one draft during chat, and one
  draft was chosen where it verified almost none). Plain decoding is measured first, then ``K`` right
  after it; unmeasured values between them are interpolated linearly — or, on an engine whose verify
  step is a captured graph of K+1 rows per request (``fixed_width``), taken as ``rho(B, K)``, which any
  step with drafts costs there — and now and then the extreme not chosen is
  measured again for ``EXPLORE_HOLD`` steps, so a change of load or acceptance is noticed (and, while
  drafting is chosen, plain decoding is measured anew for the ratios): first after
  ``EXPLORE_EVERY`` steps, then twice as long after each re-measurement that left the choice as it was
  (up to ``EXPLORE_MAX``), and ``EXPLORE_EVERY`` again after one that changed it (one during which the
  batch size changed leaves the period as it was). On open chat, where drafts rarely pay, a fixed period
  spent 3 steps in 32 verifying K drafts for nothing (~5 % of the time).
* Drafting must be predicted to beat plain decoding by ``MARGIN`` (5 %) to be chosen: the ratios are
  moving averages of single steps, on machines whose step times vary by more than that from one step to
  the next, and a draft length chosen on noise loses what plain decoding would have kept.

Only **greedy** requests adapt: their output is the target's argmax whatever is drafted, so the choice
cannot change it. Sampled requests keep ``K``: which drafts are verified changes which random numbers a
seeded request uses, and a time-based choice would make its tokens depend on the machine's load.

Glossary: *draft length* — drafts budgeted to a request for one step (``k``; the drafter may propose fewer);
*plain step* — a decode step that verified no drafts (``k = 0``), the unit step times are measured in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: pseudo-drafts at the engine's mean acceptance added to each request's own counts
PRIOR_DRAFTS = 8
#: steps between two measurements of the extreme not chosen
EXPLORE_EVERY = 32
#: the longest period between two re-measurements (module docstring)
EXPLORE_MAX = 1024
#: how much faster than plain decoding (k = 0) drafting must be predicted to be before it is chosen
MARGIN = 1.05
#: weight of a new measurement in the moving average
EMA_WEIGHT = 0.25
#: measurements of an extreme before it is trusted
MIN_SAMPLES = 2
#: steps after a plain step during which a drafting step's time is compared with it (module docstring)
REFERENCE_AGE = 8
#: weight of a new plain step in the reference (recent plain steps count: the context and the load drift)
REFERENCE_WEIGHT = 0.5
#: consecutive steps one re-measurement lasts: the step that switches verifies the drafts planned at the
#: old length and is no sample (the engine attributes a step only when it verifies and drafts one length),
#: so a one-step exploration was never measured and the extremes kept their first, warm-up times
EXPLORE_HOLD = MIN_SAMPLES + 1


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a step emits on average with ``k`` drafts each accepted with probability ``acceptance``
    (exactly ``k`` every step; ``reached_tokens`` when the number of drafts varies)."""
    a = min(max(acceptance, 0.0), 1.0)
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def reached_tokens(acceptance: float, reach: Sequence[float]) -> float:
    """Tokens a step emits on average when ``reach[j - 1]`` of the requests verify at least ``j`` drafts,
    each accepted with probability ``acceptance``: ``1 + sum_j acceptance^j reach[j - 1]``."""
    a = min(max(acceptance, 0.0), 1.0)
    return 1.0 + sum(a ** (j + 1) * r for j, r in enumerate(reach))


def reach_of(drafts: Sequence[int], k: int) -> list[float]:
    """``[k]``: the share of requests whose verified drafts (``drafts``, one count per request) reach 1..k."""
    n = max(len(drafts), 1)
    return [sum(1 for d in drafts if d >= j) / n for j in range(1, k + 1)]


@dataclass
class _Timing:
    ratio: float  # the step's time over a plain step's at the same moment (moving average; 1 at k = 0)
    reach: list[float]  # [k] share of requests verifying at least 1..k drafts in these steps (moving average)
    samples: int = 0  # steps timed against a recent plain step
    reached: int = 1  # steps whose drafts ``reach`` counts (every attributed step)

    @property
    def drafts(self) -> float:
        """Drafts verified per request on average (the sum of the shares)."""
        return sum(self.reach)


@dataclass
class _Reference:
    seconds: float  # a plain step's time now (moving average over recent plain steps)
    step: int  # the step that measured it last


@dataclass
class AdaptiveDraftLength:
    """The draft-length policy of one engine (module docstring)."""

    k: int
    times: dict[tuple[int, int], _Timing] = field(default_factory=dict)  # (batch, k) -> relative step time
    references: dict[int, _Reference] = field(default_factory=dict)  # batch -> the latest plain steps' time
    drafted: int = 0  # every verified draft so far
    accepted: int = 0
    steps: int = 0
    chosen: list[int] = field(default_factory=list)  # the k of each step that adapted (for tests, logs)
    period: int = EXPLORE_EVERY  # steps from the end of one re-measurement to the start of the next
    next_explore: int = EXPLORE_EVERY  # the step at which the next re-measurement starts
    explored_from: int | None = None  # during a re-measurement: the choice it started from
    explore_end: int = 0  # during a re-measurement: its first step after it
    explored_batch: int = 0  # during a re-measurement: the batch size it started at
    fixed_width: bool = False  # every step with drafts replays a K+1-rows-per-request graph
    clock: Callable[[], float] = time.perf_counter  # what a step's time is read from (tests pass their own)

    @property
    def mean_acceptance(self) -> float:
        return (self.accepted + 1) / (self.drafted + 2)  # Laplace: 0.5 before any draft

    def acceptance_of(self, drafted: int, accepted: int) -> float:
        """A request's acceptance estimate from its own counts and the engine's mean."""
        return (accepted + PRIOR_DRAFTS * self.mean_acceptance) / (drafted + PRIOR_DRAFTS)

    def choose(self, batch: int, acceptances: Sequence[float]) -> int:
        """The draft length of the next step for a batch of ``batch`` requests, ``acceptances`` those of
        its greedy requests (empty: nothing adapts, ``K``)."""
        self.steps += 1
        if not acceptances or self.k == 0:
            return self.k
        for extreme in (0, self.k):  # plain decoding first: drafting is timed against it
            timing = self.times.get((batch, extreme))
            if timing is None or timing.samples < MIN_SAMPLES:
                return self._chose(extreme)
        best = max(range(self.k + 1), key=lambda k: self.rate(batch, k, acceptances))
        if self.rate(batch, best, acceptances) < MARGIN * self.rate(batch, 0, acceptances):
            best = 0  # a predicted gain inside the noise of the measurements
        return self._chose(self._explored(batch, best))

    def _explored(self, batch: int, best: int) -> int:
        """``best``, or the extreme not chosen during a re-measurement (module docstring)."""
        if self.explored_from is None and self.steps >= self.next_explore:
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
        reach = self._reach(batch, k)
        return sum(reached_tokens(a, reach) for a in acceptances) / self._ratio(batch, k)

    def observe(self, batch: int, k: int, seconds: float, drafts: Sequence[int], accepted: int) -> None:
        """A decode step of ``batch`` requests with draft length ``k`` took ``seconds``; its requests
        verified ``drafts`` drafts (one count per request) and accepted ``accepted`` in all."""
        self.drafted += sum(drafts)
        self.accepted += accepted
        reference = self.references.get(batch)
        if reference is not None and self.steps - reference.step > REFERENCE_AGE:
            reference = None  # too old to compare with (module docstring)
        if k == 0:
            now = seconds if reference is None else reference.seconds
            self.references[batch] = _Reference(now + REFERENCE_WEIGHT * (seconds - now), self.steps)
        ratio = 1.0 if k == 0 else None if reference is None else seconds / reference.seconds
        timing = self.times.setdefault((batch, k), _Timing(1.0, reach_of(drafts, k), 0, 0))
        if timing.reached:
            timing.reach = [
                r + EMA_WEIGHT * (n - r) for r, n in zip(timing.reach, reach_of(drafts, k), strict=True)
            ]
        timing.reached += 1
        if ratio is not None:
            timing.ratio = timing.ratio + EMA_WEIGHT * (ratio - timing.ratio) if timing.samples else ratio
            timing.samples += 1

    def _ratio(self, batch: int, k: int) -> float:
        measured = self.times.get((batch, k))
        if measured is not None and measured.samples >= MIN_SAMPLES:
            return measured.ratio
        high = self.times[(batch, self.k)].ratio
        return high if self.fixed_width and k else 1.0 + (high - 1.0) * k / self.k

    def _reach(self, batch: int, k: int) -> list[float]:
        """``R_1 .. R_k`` of draft length ``k`` (module docstring): measured, else cut from ``K``'s."""
        measured = self.times.get((batch, k))
        if measured is not None and measured.reached >= MIN_SAMPLES:
            return measured.reach
        return self.times[(batch, self.k)].reach[:k]

    def _chose(self, k: int) -> int:
        self.chosen.append(k)
        return k


__all__ = ["AdaptiveDraftLength", "expected_tokens", "reach_of", "reached_tokens"]
