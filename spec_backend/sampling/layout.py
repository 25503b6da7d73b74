"""One verification batch's draft layout, built once per call: null drafts and per-draft indices.

Glossary: a *null draft* is a placeholder (``PLACEHOLDER_TOKEN_ID``, -1) or any id outside [0, V): it has
q = 0 and ρ = 0, is never accepted, never emitted and never used as an index (see ``metadata``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata


def null_drafts(
    draft_ids: torch.Tensor,  # [T] int32
    vocab: int,
    req_of: torch.Tensor,  # [T] int64
    slot_of: torch.Tensor,  # [T] int64
    batch: int,
    max_spec_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Null drafts: placeholders (-1) and, defensively, any id outside [0, V) (an error in debug mode).

    Returns the ids with every null draft set to ``PLACEHOLDER_TOKEN_ID`` ([T], what the ops receive:
    they treat -1 as q = 0 and ρ = 0, never as an index), the null mask [T], and each request's first
    null slot [B] (``max_spec_len`` when it has none): the accepted count never passes it.
    """
    null = (draft_ids < 0) | (draft_ids >= vocab)  # [T]
    ids = torch.where(null, torch.full_like(draft_ids, PLACEHOLDER_TOKEN_ID), draft_ids)  # [T]
    first = torch.full((batch,), max_spec_len, dtype=torch.int64, device=draft_ids.device)  # [B]
    if draft_ids.numel():
        slots = torch.where(null, slot_of, torch.full_like(slot_of, max_spec_len))  # [T]
        first = first.scatter_reduce(0, req_of, slots, reduce="amin")
    return ids, null, first


@dataclass(frozen=True)
class VerifyStep:
    """One batch's draft layout and random-number keys, built once per ``_verify_batch``."""

    batch: int
    steps: int  # max_spec_len
    cu: torch.Tensor  # [B] cumulative draft counts
    draft_ids: torch.Tensor  # [T] with every null draft as -1
    null: torch.Tensor  # [T] bool
    first_null: torch.Tensor  # [B] first null slot (max_spec_len when none)
    target_rows: torch.Tensor  # [T] int64
    bonus_rows: torch.Tensor  # [B] int64
    req_of: torch.Tensor  # [T] int64
    slot_of: torch.Tensor  # [T] int64
    seeds: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64

    @classmethod
    def of(
        cls, metadata: SpecDecodeMetadata, vocab: int, seeds: torch.Tensor, positions: torch.Tensor
    ) -> VerifyStep:
        assert metadata.request_index is not None and metadata.slot_index is not None
        req_of, slot_of = metadata.request_index, metadata.slot_index
        batch, steps = metadata.batch_size, metadata.max_spec_len
        ids, null, first = null_drafts(metadata.draft_token_ids, vocab, req_of, slot_of, batch, steps)
        return cls(
            batch, steps, metadata.cu_num_draft_tokens, ids, null, first,
            metadata.target_logits_indices.to(torch.int64), metadata.bonus_logits_indices.to(torch.int64),
            req_of, slot_of, seeds, positions,
        )  # fmt: skip


__all__ = ["VerifyStep", "null_drafts"]
