"""Capture-size planning for graph replay (CUDA graphs, ACLGraph).

During verification every request carries K+1 query tokens, so a batch of ``n`` requests is
``n·(K+1)`` tokens: every captured size is a multiple of K+1. Sizes follow vLLM's familiar ladder
(1, 2, 4, 8, then steps of 8 requests) in request units, are capped by
``min(max_num_seqs·(K+1), max_num_batched_tokens, backend cap)``, and a backend graph budget
(Ascend: hardware streams) subsamples them evenly, always keeping the smallest and the largest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

#: Request counts captured by default before the ladder switches to steps of 8.
_SMALL_BATCHES = (1, 2, 4, 8)
_LADDER_STEP = 8


@dataclass(frozen=True)
class CapturePolicy:
    """Defaults and caps for graph capture sizes.

    ``max_capture_size``: largest number of tokens one captured graph may cover (memory-bound on CUDA).
    ``graph_budget``: most graphs that may be captured (``None``: unlimited; Ascend: hardware streams).
    ``enabled``: whether this backend captures graphs at all (the reference backend runs eagerly).
    """

    max_capture_size: int
    graph_budget: int | None = None
    enabled: bool = True


class PlansCaptures(Protocol):
    """What the planner reads of a backend (every ``Backend`` has it)."""

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy: ...


def _check_positive(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _round_up(size: int, step: int) -> int:
    return -(-size // step) * step


def _default_ladder(max_requests: int) -> list[int]:
    """Request counts 1, 2, 4, 8, 16, 24, ... up to ``max_requests`` (always including it)."""
    counts = [n for n in _SMALL_BATCHES if n <= max_requests]
    counts += range(2 * _LADDER_STEP, max_requests + 1, _LADDER_STEP)
    counts.append(max_requests)
    return sorted(set(counts))


def subsample_evenly(sizes: list[int], budget: int) -> list[int]:
    """Keep at most ``budget`` sizes spread evenly over ``sizes``, keeping the first and the last."""
    _check_positive("graph budget", budget)
    if len(sizes) <= budget:
        return list(sizes)
    if budget == 1:
        return [sizes[-1]]
    last = len(sizes) - 1
    picks = {round(i * last / (budget - 1)) for i in range(budget)}
    return [sizes[i] for i in sorted(picks)]


def plan_capture_sizes(
    num_speculative_tokens: int,
    max_num_seqs: int,
    max_num_batched_tokens: int | None = None,
    requested: Iterable[int] | None = None,
    backend: PlansCaptures | None = None,
    num_hidden_layers: int | None = None,
) -> list[int]:
    """Token counts to capture graphs for, sorted ascending, each a multiple of K+1.

    ``requested`` sizes are rounded up to a multiple of K+1; sizes above the cap are dropped. Without
    any size left the plan falls back to ``[K+1]`` (one request). ``num_hidden_layers`` lets a
    stream-limited backend compute its graph budget.
    """
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int):
        raise ValueError(f"num_speculative_tokens must be an integer >= 0, got {num_speculative_tokens!r}")
    if num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
    _check_positive("max_num_seqs", max_num_seqs)
    _check_positive("max_num_batched_tokens", max_num_batched_tokens)
    step = num_speculative_tokens + 1
    cap = max_num_seqs * step
    if max_num_batched_tokens is not None:
        cap = min(cap, max_num_batched_tokens)
    budget = None
    if backend is not None:
        policy = backend.capture_policy(num_hidden_layers)
        cap = min(cap, policy.max_capture_size)
        budget = policy.graph_budget
    if requested is not None:
        wanted = list(requested)
        for size in wanted:
            _check_positive("requested capture size", size)
        sizes = sorted({_round_up(s, step) for s in wanted})
    else:
        sizes = [n * step for n in _default_ladder(max(1, cap // step))]
    sizes = [s for s in sizes if s <= cap] or [step]
    return subsample_evenly(sizes, budget) if budget is not None else sizes


def padded_size(num_tokens: int, capture_sizes: Iterable[int]) -> int | None:
    """The smallest captured size that holds ``num_tokens``; ``None`` means run eagerly."""
    fitting = [s for s in capture_sizes if s >= num_tokens]
    return min(fitting) if fitting else None


class GraphCaptureError(RuntimeError):
    """A model's decode step (or its sampler) could not be captured as graphs (e.g. an op that copies from
    the host, such as torch's float32 ``grouped_mm`` behind transformers' mixture-of-experts layers on
    CUDA); ``spec_backend.runtime.captured`` raises it, naming ``enforce_eager=True``."""
