"""Confidence-ordered, load-aware verification: how many of its drafts each request verifies, decided
from the drafter's confidences (DSpark's confidence head; ``config/confidence.py`` for the options).

Glossary:

* *confidence* ``c_{r,k}`` — the drafter's probability that draft ``k`` of request ``r`` is accepted given
  that every draft before it is;
* *survival* ``a_{r,k} = prod_{i<=k} c_{r,i}`` — the probability that draft ``k`` is accepted: verifying
  it adds ``a_{r,k}`` tokens to what the step emits on average;
* *verified tokens* ``N`` — the tokens of a decode step's target forward: one per request plus the
  drafts it verifies; ``t(N)`` is that step's time, measured on this machine (``StepCost``).

**Throughput** (the DSpark paper's hardware-aware prefix scheduler, Algorithm 1): every request starts
with no draft (``N = R`` requests, ``R`` tokens expected); the drafts of all requests are ranked by
survival, highest first (ties: earlier position, then earlier request), and admitted one by one while
``expected tokens / t(N)`` grows, stopping at the first that does not raise it. A request may verify none.

**Threshold** (DeepSpec): a request verifies its drafts up to the first whose confidence is below the
threshold.

Why this is lossless: whether draft ``k`` is verified depends on the survivals ranked before it — the
other requests' (independent of this request's drafts) and this request's earlier ones — and on its own
survival, all functions of the drafts *before* ``k``; never on draft ``k`` itself, which is what the
sampler's acceptance test needs (a stopping rule). Measured times only change which lengths are chosen.

Which requests follow the throughput rule: greedy ones (their output is the target's argmax whatever is
verified) and sampled ones without a seed. A request with a ``seed`` verifies every draft under
``throughput``, so its tokens never depend on the machine's load; the threshold rule is deterministic
and applies to every request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: measurements of a token count before it is trusted
MIN_SAMPLES = 2
#: weight of a new measurement in a token count's moving average
EMA_WEIGHT = 0.25
#: steps between two re-measurements of the full budgets (so a change of load is noticed)
EXPLORE_EVERY = 32


@dataclass
class StepCost:
    """Decode-step seconds by verified tokens: a moving average per token count, linear between the
    trusted counts and extended flat (or along the last rise) beyond them."""

    times: dict[int, tuple[float, int]] = field(default_factory=dict)  # tokens -> (seconds, samples)

    def observe(self, tokens: int, seconds: float) -> None:
        old, samples = self.times.get(tokens, (seconds, 0))
        self.times[tokens] = (old + EMA_WEIGHT * (seconds - old) if samples else seconds, samples + 1)

    def _trusted(self) -> list[tuple[int, float]]:
        return sorted((n, s) for n, (s, c) in self.times.items() if c >= MIN_SAMPLES)

    @property
    def ready(self) -> bool:
        """Two token counts are trusted: enough to compare lengths."""
        return len(self._trusted()) >= 2

    def seconds(self, tokens: int) -> float:
        points = self._trusted()
        low = max((p for p in points if p[0] <= tokens), default=None)
        high = min((p for p in points if p[0] >= tokens), default=None)
        if low is not None and high is not None:
            if high[0] == low[0]:
                return low[1]
            return low[1] + (high[1] - low[1]) * (tokens - low[0]) / (high[0] - low[0])
        (n0, s0), (n1, s1) = points[:2] if high is not None else points[-2:]
        slope = max(0.0, (s1 - s0) / (n1 - n0))
        anchor_n, anchor_s = (n0, s0) if high is not None else (n1, s1)
        return max(anchor_s + slope * (tokens - anchor_n), min(s0, s1) * 1e-3)


@dataclass
class ConfidenceVerification:
    """The verify-length rule of one engine (module docstring)."""

    mode: str  # "throughput" or "threshold"
    threshold: float = 0.0
    cost: StepCost = field(default_factory=StepCost)
    clock: Callable[[], float] = time.perf_counter
    steps: int = 0

    @property
    def timed(self) -> bool:
        """Whether decode steps must be timed (``observe``)."""
        return self.mode == "throughput"

    def observe(self, tokens: int, seconds: float) -> None:
        """A decode step verifying ``tokens`` tokens took ``seconds``."""
        self.cost.observe(tokens, seconds)

    def lengths(
        self, confidence: Sequence[Sequence[float]], available: Sequence[int], adapts: Sequence[bool]
    ) -> list[int]:
        """Drafts each request verifies: ``confidence[r][k]`` of its ``available[r]`` drafts; requests
        with ``adapts[r]`` false keep all of theirs under ``throughput``."""
        if self.mode == "threshold":
            return [_below(c[:n], self.threshold) for c, n in zip(confidence, available, strict=True)]
        self.steps += 1
        fixed = [n if not a else 0 for n, a in zip(available, adapts, strict=True)]
        if not self.cost.ready or self.steps % EXPLORE_EVERY == 0:
            return self._explore(available, fixed)
        return self._admit(confidence, available, adapts, fixed)

    def _explore(self, available: Sequence[int], fixed: list[int]) -> list[int]:
        """Until two token counts are trusted, alternate every draft and none (so both ends of the cost
        curve are measured); later, every ``EXPLORE_EVERY`` steps, every draft."""
        if self.cost.ready or (self.steps - 1) // MIN_SAMPLES % 2 == 0:
            return list(available)
        return fixed

    def _admit(
        self,
        confidence: Sequence[Sequence[float]],
        available: Sequence[int],
        adapts: Sequence[bool],
        fixed: list[int],
    ) -> list[int]:
        survival = [_survival(c[:n]) for c, n in zip(confidence, available, strict=True)]
        tokens = len(available) + sum(fixed)
        expected = len(available) + sum(sum(s[:f]) for s, f in zip(survival, fixed, strict=True))
        ranked = sorted(
            ((-a, k, r) for r, s in enumerate(survival) if adapts[r] for k, a in enumerate(s)),
        )
        lengths, best = list(fixed), expected / self.cost.seconds(tokens)
        for neg, _, r in ranked:
            rate = (expected - neg) / self.cost.seconds(tokens + 1)
            if rate <= best:
                break
            expected, tokens, best = expected - neg, tokens + 1, rate
            lengths[r] += 1
        return lengths


def _survival(confidence: Sequence[float]) -> list[float]:
    out, running = [], 1.0
    for c in confidence:
        running *= min(max(float(c), 0.0), 1.0)
        out.append(running)
    return out


def _below(confidence: Sequence[float], threshold: float) -> int:
    """Drafts before the first whose confidence is below ``threshold``."""
    return next((k for k, c in enumerate(confidence) if c < threshold), len(confidence))


def build_confidence_verification(
    mode: str | None, threshold: float | None, drafter_reports: bool
) -> ConfidenceVerification | None:
    """The rule for ``speculative_config``'s ``confidence_verification`` (``None``: ``throughput`` when
    the drafter reports confidences); ``None`` when verification does not depend on confidence."""
    if not drafter_reports or mode == "off":
        return None
    return ConfidenceVerification(mode or "throughput", threshold or 0.0)


__all__ = ["ConfidenceVerification", "StepCost", "build_confidence_verification"]
