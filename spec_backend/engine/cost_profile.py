"""The decode step's cost against its query rows, profiled when an engine with adaptive drafting starts.

Adaptive drafting (``adaptive.py``) prices a draft length by ``s(B)``: the extra time of one draft row per
request relative to a plain step at ``B`` requests (with a captured verify step of ``K + 1`` rows per
request, ``fixed_width``, the extra time of that step). Measured online alone, the policy's first choice
at each batch size had to verify ``K`` drafts to time them: for nothing where drafts do not pay (open
chat), and once again at every batch size a server meets. At start-up the engine times its own forward at
one and at ``K + 1`` query rows per request, for 1, 2, 4, … requests up to ``max_num_seqs``, on free
cache slots and the way a decode step runs it (the captured graph a step of those rows replays, else the
runner eagerly), and hands the policy those slopes (``AdaptiveDraftLength.profile``). A batch size between
two profiled ones starts at the slope interpolated between theirs. Sizes are profiled from the smallest up
until the forwards have taken ``PROFILE_BUDGET_S`` (a large model on a CPU); larger ones are measured online.
Live steps then refine a batch size's slope as before (each drafting step's time against the plain steps
of the same moment, a moving average): the profile times the target's forward only, and what verification
and a drafter's own work (a draft model's ``K`` forwards) add is what those samples bring in.

Glossary: *plain forward* — one query row per request; *verify forward* — ``K + 1`` rows per request (its
last token and ``K`` drafts); *slope* — ``s(B)`` above, in plain steps.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from spec_backend.runtime.captured import step_graph
from spec_backend.step import build_step_batch

if TYPE_CHECKING:
    from spec_backend.engine.core import EngineCore

logger = logging.getLogger("spec_backend.engine")

#: timings of each batch size and row count; their median is kept
PROFILE_REPEATS = 3
#: seconds of forwards after which no larger batch size is profiled (a large model on a CPU): those are
#: measured online, as without a profile
PROFILE_BUDGET_S = 3.0

#: ``time_step(batch, rows)``: seconds of one forward of ``batch`` requests at ``rows`` query rows each
StepTimer = Callable[[int, int], float]


def profile_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes profiled: powers of two below ``max_num_seqs``, then ``max_num_seqs`` itself."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes, batch = [], 1
    while batch < max_num_seqs:
        sizes.append(batch)
        batch *= 2
    return [*sizes, max_num_seqs]


def profile_slopes(
    time_step: StepTimer,
    k: int,
    sizes: Sequence[int],
    fixed_width: bool,
    repeats: int = PROFILE_REPEATS,
    budget_s: float = PROFILE_BUDGET_S,
) -> dict[int, float]:
    """Batch size -> ``s(B)`` from the median plain and verify forwards' times (a verify forward timed
    faster than a plain one gives 0: a draft row costs something, and the rest was noise), in the order of
    ``sizes``, stopping after the size at which the forwards' times add up to ``budget_s``."""
    if k < 1 or repeats < 1:
        raise ValueError(f"a profile needs k >= 1 and repeats >= 1, got k={k}, repeats={repeats}")
    slopes: dict[int, float] = {}
    spent = 0.0
    for batch in sizes:
        if spent >= budget_s:
            break
        # a first call at a new shape pays one-off costs (allocations, kernel choice): not kept
        warm = time_step(batch, 1) + time_step(batch, k + 1)
        plains = [time_step(batch, 1) for _ in range(repeats)]
        verifies = [time_step(batch, k + 1) for _ in range(repeats)]
        spent += warm + sum(plains) + sum(verifies)
        plain, verify = statistics.median(plains), statistics.median(verifies)
        extra = max(verify / plain - 1.0, 0.0) if plain > 0.0 else 0.0
        slopes[batch] = extra if fixed_width else extra / k
    return slopes


def forward_timer(engine: EngineCore, clock: Callable[[], float] = time.perf_counter) -> StepTimer:
    """A ``StepTimer`` over ``engine``'s runner: dummy requests (token 0, no context) on slots ``0 ..`` of
    an engine that holds none, every cache's slots forgotten after each forward."""
    runner, slots = engine.runner, engine.slots
    device = runner.cache.layout.device

    def time_step(batch: int, rows: int) -> float:
        if slots.num_slots:
            raise RuntimeError(
                f"the step cost profile needs an idle engine, {slots.num_slots} slot(s) are live"
            )
        graph = step_graph(engine.captured, engine.captured_plain, batch, rows > 1)  # as a step would
        q = graph.q if graph is not None else rows
        for _ in range(batch):
            slots.add()
        try:
            tokens = torch.zeros((batch, q), dtype=torch.int64, device=device)  # [B, q]
            step = build_step_batch(0, tokens, [q] * batch, [0] * batch, [q - 1] * batch)
            start = clock()
            out = graph.forward(step) if graph is not None else runner.forward(step, False)
            out.logits[-1, 0].item()  # the host waits for the device's work
            return clock() - start
        finally:
            runner.cache.end_step()
            slots.reset()

    return time_step


def profile_engine(engine: EngineCore) -> dict[int, float]:
    """Profile ``engine``'s step cost (module docstring) and log it; its captured graphs, if any, read
    whole slots, so the cache is zeroed after. None for a token tree's engine (adaptive drafting asked for
    explicitly): its step feeds ``1 + nodes`` rows and its graph a tree mask, which a chain's profile does
    not time, so its policy measures online (before, a captured tree's engine failed to start)."""
    adaptive = engine.adaptive
    if adaptive is None or engine.k < 1 or engine.tree is not None:
        return {}
    sizes = profile_sizes(engine.max_num_seqs)
    slopes = profile_slopes(forward_timer(engine), engine.k, sizes, adaptive.fixed_width)
    if engine.captured is not None:
        engine.runner.cache.zero_all()
    logger.info(
        "adaptive drafting: a %s costs %s of a plain step at %s request(s) (start-up profile)",
        "verify step" if adaptive.fixed_width else "draft row",
        "/".join(f"{s:.3f}" for s in slopes.values()),
        "/".join(str(b) for b in slopes),
    )
    if len(slopes) < len(sizes):
        logger.info(
            "adaptive drafting: batches above %d request(s) are timed online (the profile spent its %.0f s)",
            max(slopes),
            PROFILE_BUDGET_S,
        )
    return slopes


__all__ = [
    "PROFILE_REPEATS",
    "forward_timer",
    "profile_engine",
    "profile_sizes",
    "profile_slopes",
]
