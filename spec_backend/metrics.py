"""Speculative-decoding acceptance statistics, a periodic log line and Prometheus counters.

``SpecDecodingStats`` accumulates, over verification steps that carried drafts: the number of drafts
(request-steps with K > 0), draft tokens, accepted tokens and accepted tokens per draft position.
``SpecDecodingMetrics`` feeds the same numbers to Prometheus counters (on a registry you pass in, so
tests use their own ``CollectorRegistry``), logs a line every ``log_interval_s`` seconds, and can serve
the registry over HTTP (``serve(port)``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("spec_backend.metrics")

PREFIX = "spec_backend_spec_decode"
#: vLLM's names for the same four counters, so dashboards built for vLLM read ours unchanged.
VLLM_PREFIX = "vllm:spec_decode"
#: ``0`` leaves logging entirely to the application (see ``configure_default_logging``).
CONFIGURE_LOGGING_ENV = "SPEC_BACKEND_CONFIGURE_LOGGING"


def configure_default_logging() -> bool:
    """As vLLM does for its own logger: unless the application configured logging (the root logger or
    ``spec_backend``'s has a handler) or ``SPEC_BACKEND_CONFIGURE_LOGGING=0``, spec_backend's INFO lines
    (the periodic speculation line among them) go to stderr. Returns whether it configured anything."""
    if os.environ.get(CONFIGURE_LOGGING_ENV, "1") == "0":
        return False
    ours = logging.getLogger("spec_backend")
    if ours.handlers or logging.getLogger().handlers:
        return False
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S")
    )
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False  # the root logger has no handler anyway; no duplicates if one is added later
    return True


@dataclass
class SpecDecodingStats:
    """Acceptance counters; ``observe`` one request-step at a time, ``merge`` to combine."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    #: confidence-ordered verification (engine/confidence.py): request-steps by drafts verified (index =
    #: length) and drafts proposed but not verified
    verify_lengths: list[int] = field(default_factory=list)
    num_confidence_skipped_tokens: int = 0

    def observe_verify_lengths(self, lengths: Sequence[int], available: Sequence[int]) -> None:
        """Each request of a step verifies ``lengths[r]`` of its ``available[r]`` drafts."""
        for length in lengths:
            self.verify_lengths.extend([0] * (length + 1 - len(self.verify_lengths)))
            self.verify_lengths[length] += 1
        self.num_confidence_skipped_tokens += sum(available) - sum(lengths)

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Record one request's verification: ``num_draft_tokens`` drafted, the first
        ``num_accepted_tokens`` of them accepted."""
        if not 0 <= num_accepted_tokens <= num_draft_tokens:
            raise ValueError(
                f"accepted {num_accepted_tokens} of {num_draft_tokens} draft tokens is impossible"
            )
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        if len(self.accepted_per_position) < num_draft_tokens:
            self.accepted_per_position.extend([0] * (num_draft_tokens - len(self.accepted_per_position)))
        for pos in range(num_accepted_tokens):
            self.accepted_per_position[pos] += 1

    def merge(self, other: SpecDecodingStats) -> None:
        """Add ``other``'s counters to this one."""
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        mine = self.accepted_per_position + [0] * (n - len(self.accepted_per_position))
        theirs = other.accepted_per_position + [0] * (n - len(other.accepted_per_position))
        self.accepted_per_position = [a + b for a, b in zip(mine, theirs, strict=True)]
        for length, count in enumerate(other.verify_lengths):
            self.verify_lengths.extend([0] * (length + 1 - len(self.verify_lengths)))
            self.verify_lengths[length] += count
        self.num_confidence_skipped_tokens += other.num_confidence_skipped_tokens

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0.0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verification step with drafts: 1 (bonus/recovered) + accepted per draft."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_acceptance_rate(self) -> list[float]:
        """Fraction of drafts whose token at position i was accepted."""
        return [a / self.num_drafts for a in self.accepted_per_position] if self.num_drafts else []

    def log_line(self) -> str:
        """One human-readable summary line."""
        per_pos = ", ".join(f"{r:.3f}" for r in self.per_position_acceptance_rate)
        return (
            f"SpecDecoding metrics: mean acceptance length: {self.mean_acceptance_length:.2f}, "
            f"acceptance rate: {100 * self.acceptance_rate:.1f}%, "
            f"accepted tokens: {self.num_accepted_tokens}, "
            f"drafted tokens: {self.num_draft_tokens}, drafts: {self.num_drafts}, "
            f"per-position acceptance rate: [{per_pos}]"
        ) + (
            f", verified drafts per request (by confidence): {self.verify_lengths}, "
            f"skipped: {self.num_confidence_skipped_tokens}"
            if self.verify_lengths
            else ""
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON reports."""
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "verify_lengths": list(self.verify_lengths),
            "num_confidence_skipped_tokens": self.num_confidence_skipped_tokens,
        }


@dataclass(frozen=True)
class CounterMetric:
    """A counter as vLLM's ``LLM.get_metrics()`` reports it (``vllm.v1.metrics.reader.Counter``)."""

    name: str
    value: int
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VectorMetric:
    """A per-position counter as vLLM reports it (``vllm.v1.metrics.reader.Vector``)."""

    name: str
    values: list[int]
    labels: dict[str, str] = field(default_factory=dict)


def vllm_metrics(stats: SpecDecodingStats) -> list[CounterMetric | VectorMetric]:
    """``stats`` under vLLM's metric names, the shape ``LLM.get_metrics()`` returns in vLLM."""
    return [
        CounterMetric(f"{VLLM_PREFIX}_num_drafts", stats.num_drafts),
        CounterMetric(f"{VLLM_PREFIX}_num_draft_tokens", stats.num_draft_tokens),
        CounterMetric(f"{VLLM_PREFIX}_num_accepted_tokens", stats.num_accepted_tokens),
        VectorMetric(f"{VLLM_PREFIX}_num_accepted_tokens_per_pos", list(stats.accepted_per_position)),
    ]


class SpecDecodingMetrics:
    """Lifetime ``SpecDecodingStats`` plus Prometheus counters and a periodic log line.

    ``registry``: a ``prometheus_client.CollectorRegistry`` (default: a fresh private one, so several
    engines in one process never collide; pass ``prometheus_client.REGISTRY`` to export globally).
    ``log_interval_s``: seconds between log lines (``None`` disables logging).
    """

    def __init__(self, registry: Any | None = None, log_interval_s: float | None = 10.0) -> None:
        from prometheus_client import CollectorRegistry, Counter

        self.registry = registry if registry is not None else CollectorRegistry()
        self.total = SpecDecodingStats()
        self._window = SpecDecodingStats()
        self.log_interval_s = log_interval_s
        self._last_log = time.monotonic()
        # each counter twice: under our prefix and under vLLM's (PREFIX, VLLM_PREFIX)
        self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, self.num_accepted_tokens_per_pos = (
            tuple(
                Counter(f"{prefix}_{stem}", doc, labels, registry=self.registry)
                for prefix in (PREFIX, VLLM_PREFIX)
            )
            for stem, doc, labels in (
                ("num_drafts", "Verification steps that carried drafts", []),
                ("num_draft_tokens", "Draft tokens proposed", []),
                ("num_accepted_tokens", "Draft tokens accepted", []),
                ("num_accepted_tokens_per_pos", "Draft tokens accepted, per draft position", ["position"]),
            )
        )

        self._positions: dict[tuple[int, int], Any] = {}  # (ours or vLLM's, position) -> counter child
        self.verify_length = Counter(
            f"{PREFIX}_confidence_verify_length",
            "Request-steps by the drafts they verified, as the drafter's confidences chose",
            ["length"],
            registry=self.registry,
        )
        self.confidence_skipped = Counter(
            f"{PREFIX}_confidence_skipped_tokens",
            "Drafts proposed but not verified, as the drafter's confidences chose",
            registry=self.registry,
        )

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Record one request's verification step (see ``SpecDecodingStats.observe``: an impossible pair
        raises, ``(0, a > 0)`` included)."""
        self.observe_many([num_draft_tokens], [num_accepted_tokens], log=False)

    def _count(self, step: SpecDecodingStats) -> None:
        """Add one step's counts to the Prometheus counters: a few increments per step, not per request
        (at 16 requests a step, one ``inc`` and one ``labels`` lookup per request and accepted position
        cost ~0.2 ms of a ~3 ms step on the tiny benchmark model), position children looked up once."""
        for ours_or_vllms in range(2):
            self.num_drafts[ours_or_vllms].inc(step.num_drafts)
            self.num_draft_tokens[ours_or_vllms].inc(step.num_draft_tokens)
            self.num_accepted_tokens[ours_or_vllms].inc(step.num_accepted_tokens)
            for pos, count in enumerate(step.accepted_per_position):
                if count:  # a position nobody reached gets no series, as before
                    self._position(ours_or_vllms, pos).inc(count)

    def _position(self, ours_or_vllms: int, pos: int) -> Any:
        """The per-position counter's child for ``pos`` (cached: ``labels`` builds a key each call)."""
        child = self._positions.get((ours_or_vllms, pos))
        if child is None:
            counter = self.num_accepted_tokens_per_pos[ours_or_vllms]
            child = self._positions[(ours_or_vllms, pos)] = counter.labels(position=str(pos))
        return child

    def observe_verify_lengths(self, lengths: Sequence[int], available: Sequence[int]) -> None:
        """Record a step's confidence-chosen verify lengths (``SpecDecodingStats.observe_verify_lengths``)."""
        self.total.observe_verify_lengths(lengths, available)
        self._window.observe_verify_lengths(lengths, available)
        for length in lengths:
            self.verify_length.labels(length=str(length)).inc()
        self.confidence_skipped.inc(sum(available) - sum(lengths))

    def observe_many(
        self, draft_counts: Sequence[int], accepted_counts: Sequence[int], log: bool = True
    ) -> None:
        """Record each request's (drafted, accepted) pair of one step, then maybe log. An impossible pair
        (more accepted than drafted, a request with no drafts included) raises ``ValueError`` before
        anything is recorded."""
        step = SpecDecodingStats()
        for drafted, accepted in zip(draft_counts, accepted_counts, strict=True):
            step.observe(drafted, accepted)
        if step.num_drafts:
            self.total.merge(step)
            self._window.merge(step)
            self._count(step)
        if log:
            self.maybe_log()

    def maybe_log(self, force: bool = False) -> str | None:
        """Log (and return) the window's line when the interval elapsed or ``force``; reset the window."""
        now = time.monotonic()
        if self._window.num_drafts == 0:
            return None
        if not force and (self.log_interval_s is None or now - self._last_log < self.log_interval_s):
            return None
        line = self._window.log_line()
        logger.info(line)
        self._window = SpecDecodingStats()
        self._last_log = now
        return line

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose the registry at ``http://addr:port/metrics`` (a daemon thread)."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=addr, registry=self.registry)


__all__ = ["PREFIX", "SpecDecodingMetrics", "SpecDecodingStats"]
