"""Checking a draft checkpoint's tensors against the shapes its config implies, with one clear error."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch


def check_tensors(
    kind: str,
    path: str,
    expected: Mapping[str, tuple[int, ...]],
    tensors: Mapping[str, torch.Tensor],
    optional: Iterable[str] = (),
) -> None:
    """Raise ``ValueError`` naming every missing, unexpected and mis-shaped tensor of ``kind`` at ``path``."""
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected) - set(optional))
    wrong = [
        f"{k}: {list(tensors[k].shape)} (expected {list(s)})"
        for k, s in expected.items()
        if k in tensors and tuple(tensors[k].shape) != s
    ]
    if missing or extra or wrong:
        raise ValueError(
            f"{kind} checkpoint {path!r} does not match its config.json: missing {missing}, "
            f"unexpected {extra}, wrong shapes {wrong}"
        )


__all__ = ["check_tensors"]
