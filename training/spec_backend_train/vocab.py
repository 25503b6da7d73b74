"""A reduced draft vocabulary from token frequencies, as EAGLE-3's ``d2t``/``t2d`` (see
``spec_backend.models.draft_vocab`` for their meaning)."""

from __future__ import annotations

import torch


def draft_vocabulary(counts: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``size`` most frequent target ids (ties: lower id first) as ``d2t int64[size]`` (offsets,
    ascending target ids) and ``t2d bool[V]``. ``counts``: ``[V]`` occurrences of each target id."""
    vocab = counts.numel()
    if counts.dim() != 1 or not 1 <= size <= vocab:
        raise ValueError(f"size must be in [1, {vocab}] for counts of shape {list(counts.shape)}, got {size}")
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))[:size]
    ids = torch.tensor(sorted(order), dtype=torch.int64)  # [Vd] ascending target ids
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(size), t2d


__all__ = ["draft_vocabulary"]
