"""Synthetic acceptance: per-position rates from either explicit rates or a mean acceptance length.

Rates are *unconditional*: entry ``i`` is the probability that the first ``i + 1`` draft tokens are all
accepted, so a valid schedule lies in [0, 1] and never increases. The mean acceptance length (tokens
emitted per step, bonus token included) of a schedule is ``1 + sum(rates)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def acceptance_length_to_rates(length: float, num_speculative_tokens: int) -> list[float]:
    """Minimum-variance schedule with mean acceptance length ``length``.

    The expected number of accepted drafts ``length - 1`` is split into ``floor`` positions accepted
    with certainty, one position holding the fractional remainder, and zeros after it. ``length`` must
    already lie in [1, K + 1].
    """
    accepted = length - 1.0
    full = min(math.floor(accepted), num_speculative_tokens)
    rates = [1.0] * full
    if full < num_speculative_tokens:
        rates.append(accepted - full)
    rates.extend([0.0] * (num_speculative_tokens - len(rates)))
    return rates


def resolve_synthetic_acceptance_rates(
    num_speculative_tokens: int,
    rates: Sequence[float] | None,
    length: float | None,
) -> list[float]:
    """Validate exactly one of ``rates`` / ``length`` and return the per-position rates.

    Raises ``ValueError`` when both or neither are given, when ``rates`` has the wrong length, leaves
    [0, 1] or increases, or when ``length`` is outside [1, K + 1].
    """
    k = num_speculative_tokens
    if (rates is None) == (length is None):
        raise ValueError(
            "rejection_sample_method='synthetic' needs exactly one of synthetic_acceptance_rates or "
            f"synthetic_acceptance_length, got synthetic_acceptance_rates={rates!r} and "
            f"synthetic_acceptance_length={length!r}"
        )
    if rates is not None:
        values = list(rates)
        if len(values) != k:
            raise ValueError(
                f"synthetic_acceptance_rates must have one entry per speculative token "
                f"(num_speculative_tokens={k}), got {len(values)} entries: {values}"
            )
        bad = [r for r in values if not 0.0 <= r <= 1.0]
        if bad:
            raise ValueError(f"synthetic_acceptance_rates entries must be in [0, 1], got {values}")
        rises = [i for i in range(1, k) if values[i] > values[i - 1]]
        if rises:
            raise ValueError(
                "synthetic_acceptance_rates must be non-increasing (entry i is the probability that the "
                f"first i+1 drafts are all accepted), got {values}: entry {rises[0]} rises above entry "
                f"{rises[0] - 1}"
            )
        return values
    assert length is not None
    if not 1.0 <= length <= float(k + 1):
        raise ValueError(
            f"synthetic_acceptance_length must be in [1, num_speculative_tokens + 1] = [1, {k + 1}], "
            f"got {length!r}"
        )
    return acceptance_length_to_rates(length, k)


__all__ = ["acceptance_length_to_rates", "resolve_synthetic_acceptance_rates"]
