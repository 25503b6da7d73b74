"""Which few-row float32 products run as tall-skinny BLAS calls on this machine, measured when a model loads.

A decode step multiplies a few rows (batch × verified positions) by every weight. Which BLAS call is faster
for that depends on the CPU and the BLAS build, not on the model alone: on the 2-core AMD EPYC where
``TallSkinnyProjection`` was introduced, ``(W @ x.T).T`` read SmolLM2's 210 decoder weights 1.2-3.6x faster
than ``F.linear`` at 1-4 rows (and its 49152-row head 2-6x faster); on a 2-core Intel Xeon VM with the same
torch (MKL 2024.2) the same pass with the tall-skinny product took 3.3x **longer** at 1 row and 1.9x at 2
(``benchmarks/bench_small_batch_linear.py``). A fixed rule was right on one and wrong on the other, so the
choice is measured.

Glossary:

* **rows set** — the row counts ``M`` at which a projection runs the tall-skinny product (an odd ``M``
  padded with a copy of its last row); every other ``M`` runs ``F.linear``.
* **measurement** — one pass over the group's weights (the decoder's projections, or the head; at most
  ``STREAM_BYTES`` of them, so a large model's pass streams from memory as its steps do, and a tiny
  model's stays in cache as its steps do) for each candidate ``M``, with each product, ``REPEATS`` times
  interleaved after a warm-up; the best time of each counts.
* **rule** — a candidate joins the rows set when the tall-skinny pass takes at most ``MARGIN`` of
  ``F.linear``'s (near parity keeps torch's default); an ``M`` between candidates follows the largest
  candidate below it; past the last candidate, ``F.linear``.
* **override** — ``SPEC_BACKEND_FEW_ROWS=linear`` (never tall-skinny), ``tall`` (every ``M`` up to the last
  candidate) or ``measure`` (the default).

Both products equal the float64 result up to float32 summation order, so either is exact to the same
tolerance; the choice is made once per process for a group's shapes (two engines on one model run the
same products and give the same tokens), logged with its times, and separate processes measure anew.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

logger = logging.getLogger("spec_backend.backends")

ROWS_ENV = "SPEC_BACKEND_FEW_ROWS"
#: the row counts measured for a decoder's projections and for an LM head
DECODER_ROWS = (1, 2, 3, 4, 5, 6, 8, 16)
HEAD_ROWS = (1, 2, 3, 4, 5, 6, 8, 16, 32, 64)
#: most weight bytes one measured pass reads
STREAM_BYTES = 64 << 20
#: timed passes per candidate and product, after one warm-up
REPEATS = 3
#: the tall-skinny pass must take at most this share of F.linear's
MARGIN = 0.85


def tall_skinny(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
    """``(W @ rows.T).T``, an odd row count padded with a copy of its last row (a stride-0 expand takes the
    slow kernel again)."""
    m = rows.shape[0]
    if m % 2 == 1:
        rows = torch.cat([rows, rows[-1:]])  # [M + 1, K]
    return torch.matmul(weight, rows.T).T[:m]


@dataclass(frozen=True)
class RowsChoice:
    """A group's rows set, why, and the best pass times per candidate: ``M -> (F.linear s, tall s)``."""

    rows: frozenset[int]
    reason: str
    times: tuple[tuple[int, float, float], ...] = ()


def choose(times: dict[int, tuple[float, float]], candidates: Sequence[int]) -> frozenset[int]:
    """The rows set the rule (module glossary) gives for the measured ``times`` of ``candidates``."""
    ordered = sorted(candidates)
    chosen: set[int] = set()
    for i, m in enumerate(ordered):
        linear, tall = times[m]
        if tall <= MARGIN * linear:
            upto = ordered[i + 1] if i + 1 < len(ordered) else m + 1
            chosen.update(range(m, upto))
    return frozenset(chosen)


def rows_set(weights: Sequence[torch.Tensor], candidates: Sequence[int]) -> RowsChoice:
    """The rows set of a group of float32 weights ``[N, K]`` (module glossary), pinned by ``ROWS_ENV`` or
    measured once per process for the group's shapes; a ``ValueError`` names an unknown override."""
    mode = os.environ.get(ROWS_ENV, "").strip() or "measure"
    if mode not in ("measure", "linear", "tall"):
        raise ValueError(f"{ROWS_ENV} must be one of measure, linear, tall; got {mode!r}")
    if mode == "linear" or not weights:
        return RowsChoice(frozenset(), f"{ROWS_ENV}=linear" if weights else "no weights")
    if mode == "tall":
        return RowsChoice(frozenset(range(1, max(candidates) + 1)), f"{ROWS_ENV}=tall")
    streamed, total = [], 0
    for w in weights:
        if total >= STREAM_BYTES:
            break
        streamed.append(w)
        total += w.numel() * w.element_size()
    key = (
        tuple((int(w.shape[0]), int(w.shape[1])) for w in streamed),
        tuple(candidates),
        torch.get_num_threads(),
    )
    found = _CHOICES.get(key)
    if found is None:
        found = _CHOICES[key] = _measure(streamed, candidates)
        logger.info(
            "spec_backend: few-row float32 products (%d weights): tall-skinny at %s rows; best pass ms "
            "F.linear/tall-skinny per rows: %s",
            len(streamed), sorted(found.rows) or "no", ", ".join(
                f"{m}: {1e3 * a:.3f}/{1e3 * b:.3f}" for m, a, b in found.times
            ),
        )  # fmt: skip
    return found


#: the measured choices of this process, by (weight shapes, candidates, torch threads)
_CHOICES: dict[tuple[object, ...], RowsChoice] = {}


@torch.inference_mode()
def _measure(weights: Sequence[torch.Tensor], candidates: Sequence[int]) -> RowsChoice:
    gen = torch.Generator().manual_seed(0)
    widths = {int(w.shape[1]) for w in weights}
    times: dict[int, tuple[float, float]] = {}
    for m in candidates:
        x = {k: torch.randn(m, k, generator=gen) for k in widths}  # [M, K]
        passes: list[Callable[[], None]] = [
            functools.partial(_pass, F.linear, weights, x),
            functools.partial(_pass, tall_skinny, weights, x),
        ]
        best = [float("inf"), float("inf")]
        for run in passes:
            run()  # warm-up
        for _ in range(REPEATS):
            for i, run in enumerate(passes):
                start = time.perf_counter()
                run()
                best[i] = min(best[i], time.perf_counter() - start)
        times[m] = (best[0], best[1])
    rows = choose(times, candidates)
    ordered = tuple((m, *times[m]) for m in candidates)
    return RowsChoice(rows, "measured", ordered)


def _pass(
    product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    weights: Sequence[torch.Tensor],
    x: dict[int, torch.Tensor],
) -> None:
    for w in weights:
        product(x[int(w.shape[1])], w)


__all__ = [
    "DECODER_ROWS",
    "HEAD_ROWS",
    "MARGIN",
    "ROWS_ENV",
    "RowsChoice",
    "choose",
    "rows_set",
    "tall_skinny",
]
