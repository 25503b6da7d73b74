"""Reduced draft vocabularies (EAGLE-3, speculators DFlash): ``d2t``/``t2d`` checked and applied.

Glossary: ``V`` target vocabulary, ``Vd`` draft vocabulary; ``d2t[i]`` is an *offset*: draft id ``i`` is
target id ``i + d2t[i]``; ``t2d`` marks the target ids in the draft vocabulary (``sum(t2d) == Vd``).
Draft logits ``[*, Vd]`` become target logits ``[*, V]`` with ``-inf`` outside the draft vocabulary, so
a draft never leaves it and its probability there is exactly 0.
"""

from __future__ import annotations

import torch


def target_ids(kind: str, path: str, d2t: torch.Tensor, t2d: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """The target id of every draft id ``[Vd]``; ``ValueError`` unless ``d2t`` maps to distinct ids in
    ``[0, vocab)`` and ``t2d`` (when given) marks exactly those ids."""
    ids = torch.arange(d2t.numel()) + d2t.to(torch.int64)  # [Vd]
    distinct = torch.unique(ids).numel() == ids.numel()
    if d2t.dim() != 1 or int(ids.min()) < 0 or int(ids.max()) >= vocab or not distinct:
        raise ValueError(
            f"{kind} checkpoint {path!r}: d2t must map the {d2t.numel()} draft ids to distinct target ids "
            f"in [0, {vocab}) (target = draft + d2t[draft])"
        )
    if t2d is not None and (
        t2d.shape != (vocab,) or not bool(t2d.bool()[ids].all()) or int(t2d.sum()) != ids.numel()
    ):
        raise ValueError(
            f"{kind} checkpoint {path!r}: t2d (shape {list(t2d.shape)}) must be a bool[{vocab}] mask "
            "marking exactly the target ids d2t maps to"
        )
    return ids


def to_target_logits(draft: torch.Tensor, ids: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """Draft logits ``[..., Vd]`` placed at their target ids in ``[..., V]`` (``-inf`` elsewhere);
    ``ids is None`` means the draft vocabulary is the target's."""
    if ids is None:
        return draft
    full = draft.new_full((*draft.shape[:-1], vocab), float("-inf"))  # [..., V]
    full[..., ids] = draft
    return full


__all__ = ["target_ids", "to_target_logits"]
