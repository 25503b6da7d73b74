# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""Pieces the triton tree kernels share (``triton.tree``: point-mass trees; ``triton.tree_sampled``:
sampled siblings)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _target_argmax(argmax_ptr, row, greedy, HAS_ARGMAX: tl.constexpr):
    if HAS_ARGMAX:
        return tl.load(argmax_ptr + row, mask=greedy, other=-1).to(tl.int64)
    else:
        return tl.zeros((), tl.int64) - 1


@triton.jit
def _crossing(idx, live, mass, running, threshold, chosen, last, V):
    """One vocabulary block of an inverse-CDF scan: ``chosen`` becomes the first index whose running
    mass exceeds ``threshold`` (if not found yet), ``last`` the last index of positive mass so far;
    returns them and the running mass after the block."""
    cdf = running + tl.cumsum(mass, axis=0)
    hit = (cdf > threshold) & (mass > 0) & live
    first = tl.min(tl.where(hit, idx, V), axis=0).to(tl.int64)
    chosen = tl.where((chosen < 0) & (first < V), first, chosen)
    last = tl.maximum(last, tl.max(tl.where(live & (mass > 0), idx, -1), axis=0).to(tl.int64))
    return chosen, last, running + tl.sum(mass, axis=0)
