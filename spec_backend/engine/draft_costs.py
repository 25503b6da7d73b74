"""What adaptive drafting measures at one batch size, and the expected tokens of a draft length.

The policy (``adaptive.py``) picks the draft length ``k`` that maximises expected tokens over cost; this
module keeps the measurements its costs come from, all as ratios to a plain step of the same moment:

* **Reference** ``t_0``: a moving average of the recent steps that verified no draft (``REFERENCE_AGE``).
* **Slope** ``s``: the extra time of a draft row per request (``fixed_width``: of a verify step), from steps
  that verified ``x > 0`` drafts: ``(t / t_0 - 1 - A) * B / x`` (flat: ``t / t_0 - 1 - A``).
* **Ask** ``A``: the extra time of a step whose drafter was asked for drafts (a budget ``k > 0``, or a
  shadow's lookup, ``shadow_drafts``) over one where it was not (a held step, ``adaptive.hold``), from
  steps that asked and got none (``t / t_0 - 1``, against a reference refreshed by a step
  that did not ask within ``REFERENCE_AGE``). A host lookup (n-gram, suffix) costs the same whatever it
  finds, and on open chat it mostly finds nothing: counted as plain steps, such steps made the reference
  a step with a lookup (about 3 % of a SmolLM2 step on a 2-core VM for suffix), so drafting was compared
  with plain decoding that paid the lookup too, and chosen where plain decoding was faster. A step that
  asked enters the reference as ``t / (1 + A)``.
* **Cost** ``C(B, 0) = 1`` and ``C(B, k) = 1 + A + s * sum_{j<=k} R_j`` (``fixed_width``:
  ``1 + A + s * (1 - (1 - R_1)^B)``), with ``R_j`` the reach (the share of requests proposed at least ``j``
  drafts).

Glossary: *plain step* — a decode step that verified no draft; *asking* — the drafter's call for the next
step's drafts (a budget above 0) or for a shadow's, paid whether or not it finds any.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: weight of a new measurement in the moving averages
EMA_WEIGHT = 0.25
#: measurements (plain steps, drafting steps) before they are trusted
MIN_SAMPLES = 2
#: steps after a plain step during which a drafting step's time is compared with it (module docstring)
REFERENCE_AGE = 8
#: weight of a new plain step in the reference (recent plain steps count: the context and the load drift)
REFERENCE_WEIGHT = 0.5


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
class BatchCosts:
    """What is measured at one batch size (module docstring)."""

    reach: list[float]  # [K] R_j: share of requests proposed at least j drafts (moving averages)
    reached: list[int]  # [K] samples of each R_j
    slope: float = (
        0.0  # s: extra time of a draft row per request (fixed_width: of a verify step), plain steps
    )
    samples: int = 0  # drafting steps timed against a recent plain step
    sample_step: int = -(2**62)  # the step that timed drafting last
    plain: int = 0  # steps without drafts timed
    reference: float = 0.0  # a plain step's time now (moving average over recent steps without drafts)
    reference_step: int = -(2**62)  # the step that timed it last
    ask: float = 0.0  # A: extra time of a step that asks the drafter for drafts, in plain steps
    asks: int = 0  # steps that asked and got none, timed against a recent step that did not ask
    unasked_step: int = -(2**62)  # the step that timed a step that did not ask last

    def add_reach(self, drafts: Sequence[int], k: int) -> None:
        """Requests were proposed ``drafts`` drafts (one count each) under a budget of ``k``: R_1..R_k."""
        for j, share in enumerate(reach_of(drafts, k)):
            old = self.reach[j]
            self.reach[j] = old + EMA_WEIGHT * (share - old) if self.reached[j] else share
            self.reached[j] += 1

    def observe(
        self, step: int, asked: bool, seconds: float, rows: int, batch: int, fixed_width: bool
    ) -> None:
        """Step ``step`` of ``batch`` requests verified ``rows`` drafts in all and took ``seconds``;
        ``asked``: its drafter was asked for drafts (a budget above 0, or a shadow's lookup)."""
        fresh = step - self.reference_step <= REFERENCE_AGE
        if not rows:  # no drafts: the reference, less the drafter's asking if it was asked
            if not asked:
                self.unasked_step = step
            elif step - self.unasked_step <= REFERENCE_AGE and self.reference > 0.0:
                ask = seconds / self.reference - 1.0
                self.ask = self.ask + EMA_WEIGHT * (ask - self.ask) if self.asks else ask
                self.asks += 1
            if asked:
                seconds /= 1.0 + max(self.ask, 0.0)  # what the step would have taken without asking
            now = self.reference if fresh else seconds
            self.reference = now + REFERENCE_WEIGHT * (seconds - now)
            self.reference_step, self.plain = step, self.plain + 1
            return
        if not fresh or self.reference <= 0.0:
            return  # too long after a plain step to compare with it (module docstring)
        extra = seconds / self.reference - 1.0 - max(self.ask, 0.0)
        slope = extra if fixed_width else extra * batch / rows
        self.slope = self.slope + EMA_WEIGHT * (slope - self.slope) if self.samples else slope
        self.samples, self.sample_step = self.samples + 1, step

    def cost(self, k: int, batch: int, fixed_width: bool) -> float:
        """``C(B, k)``: a step's expected time with draft length ``k``, in plain steps (module docstring)."""
        if k == 0:
            return 1.0
        slope = max(self.slope, 0.0)  # a draft row costs something: a faster step was noise
        ask = 1.0 + max(self.ask, 0.0)
        if fixed_width:
            return ask + slope * (1.0 - (1.0 - self.reach[0]) ** batch)
        return ask + slope * sum(self.reach[:k])


__all__ = ["BatchCosts", "expected_tokens", "interpolated", "reach_of", "reached_tokens"]
