"""FLy verification settings (vLLM 0.33's ``rejection_sample_method="fly"``; **lossy**).

Glossary (vLLM's names, ``vllm/config/speculative.py``):

* ``fly_window_size`` W: a rejected draft is *rescued* only when the W drafts after it are all accepted
  by the native rule; default ``min(6, K - 1)``; it must be in [1, K).
* ``fly_entropy_threshold``: the rescue also needs the target's top-k entropy at the rejected position
  to be at least this (nats, ``>= 0``; default 0.3).
* ``fly_entropy_top_k``: how many of the largest target probabilities that entropy sums (``>= 1``;
  default 3).

FLy needs K >= 2 (a window needs a draft after the rejected one). The algorithm lives in
``spec_backend.sampling.fly``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: vLLM's defaults
DEFAULT_FLY_WINDOW_CAP = 6
DEFAULT_FLY_ENTROPY_THRESHOLD = 0.3
DEFAULT_FLY_ENTROPY_TOP_K = 3


@dataclass(frozen=True)
class FlyConfig:
    """Validated FLy parameters for the rejection sampler (see the module docstring)."""

    window_size: int
    entropy_threshold: float = DEFAULT_FLY_ENTROPY_THRESHOLD
    entropy_top_k: int = DEFAULT_FLY_ENTROPY_TOP_K

    def __post_init__(self) -> None:
        w = self.window_size
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"fly_window_size must be an int >= 1, got {w!r}")
        t = self.entropy_threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or math.isnan(t) or t < 0:
            raise ValueError(f"fly_entropy_threshold must be a number >= 0, got {t!r}")
        k = self.entropy_top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"fly_entropy_top_k must be an int >= 1, got {k!r}")


def resolve_fly(
    num_speculative_tokens: int, window_size: int | None, entropy_threshold: float, entropy_top_k: int
) -> FlyConfig:
    """vLLM's FLy rules: K >= 2; the window defaults to ``min(6, K - 1)`` and must be smaller than K."""
    k = num_speculative_tokens
    if k < 2:
        raise ValueError(
            f"rejection_sample_method='fly' needs num_speculative_tokens >= 2 (a rescue window needs a "
            f"draft after the rejected one), got {k}"
        )
    window = min(DEFAULT_FLY_WINDOW_CAP, k - 1) if window_size is None else window_size
    if window >= k:
        raise ValueError(
            f"fly_window_size must be smaller than num_speculative_tokens={k}, got {window} "
            f"(allowed: 1..{k - 1})"
        )
    return FlyConfig(window, entropy_threshold, entropy_top_k)


__all__ = [
    "DEFAULT_FLY_ENTROPY_THRESHOLD",
    "DEFAULT_FLY_ENTROPY_TOP_K",
    "DEFAULT_FLY_WINDOW_CAP",
    "FlyConfig",
    "resolve_fly",
]
