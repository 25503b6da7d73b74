"""Drafts waiting for the next decode step, per request (draft-next runs at the end of a step)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spec_backend.engine.request import Request
from spec_backend.proposers.contract import DraftOutput
from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID


@dataclass(frozen=True)
class _Drafts:
    token_ids: torch.Tensor  # [K] int64
    count: int
    probs: torch.Tensor | None  # [K, V] float32


@dataclass(frozen=True)
class DecodeInputs:
    """One decode step's query tokens ``[B, 1 + K_max]``, draft counts and draft probabilities."""

    tokens: torch.Tensor  # [B, 1 + K_max] int64, placeholders past each count
    counts: list[int]  # host [B]
    probs: torch.Tensor | None  # [B, K_max, V] float32 (zeros where a request has none)


class PendingDrafts:
    """Per-request drafts from the last draft-next, validated against the budgets and the vocabulary."""

    def __init__(self) -> None:
        self._drafts: dict[str, _Drafts] = {}

    def store(
        self, requests: Sequence[Request], out: DraftOutput, budgets: Sequence[int], vocab_size: int
    ) -> None:
        """Keep ``out``'s drafts; a count is cut at its budget. From the first id outside [0, V) on, ids
        become placeholders on the device (no read back): the sampler ends that request's drafts there,
        as if the count had been cut, and the step counts only the valid ones (``valid_drafts``)."""
        ids = out.token_ids  # [B, K]
        valid = torch.cumprod(((ids >= 0) & (ids < vocab_size)).to(torch.int64), dim=1).bool()  # [B, K]
        ids = torch.where(valid, ids, torch.full_like(ids, PLACEHOLDER_TOKEN_ID))  # [B, K]
        for b, request in enumerate(requests):
            count = min(out.num_draft_tokens[b], budgets[b])
            probs = out.draft_probs[b] if out.draft_probs is not None else None
            self._drafts[request.request_id] = _Drafts(ids[b], max(0, count), probs)

    def drop(self, request_id: str) -> None:
        self._drafts.pop(request_id, None)

    def take(self, requests: Sequence[Request], device: torch.device) -> DecodeInputs:
        """The decode inputs of ``requests`` (drafts are consumed; failed requests feed no drafts)."""
        entries = [self._drafts.pop(r.request_id, None) for r in requests]
        counts = [
            e.count if e is not None and not r.finished else 0 for e, r in zip(entries, requests, strict=True)
        ]
        k_max = max(counts, default=0)
        last = torch.tensor([r.output_token_ids[-1] for r in requests], dtype=torch.int64).to(device)  # [B]
        tokens = torch.full(
            (len(requests), 1 + k_max), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device
        )
        tokens[:, 0] = last
        probs: torch.Tensor | None = None
        if k_max:
            for b, (entry, count) in enumerate(zip(entries, counts, strict=True)):
                if count:
                    assert entry is not None
                    tokens[b, 1 : 1 + count] = entry.token_ids[:count]
            drafted = [b for b, c in enumerate(counts) if c]
            with_probs = [b for b in drafted if entries[b] is not None and entries[b].probs is not None]  # type: ignore[union-attr]
            if with_probs and len(with_probs) != len(drafted):
                raise ValueError("a drafter returned draft probabilities for some requests of a batch only")
            if with_probs:
                first = entries[with_probs[0]]
                assert first is not None and first.probs is not None
                probs = torch.zeros(
                    (len(requests), k_max, first.probs.shape[-1]), dtype=torch.float32, device=device
                )
                for b in with_probs:
                    entry = entries[b]
                    assert entry is not None and entry.probs is not None
                    probs[b, : counts[b]] = entry.probs[: counts[b]]
        return DecodeInputs(tokens, counts, probs)


def valid_drafts(tokens: torch.Tensor) -> torch.Tensor:  # [B] int64
    """Each request's drafts before its first placeholder, from the query tokens ``[B, 1 + K]`` (the
    last token, then the drafts)."""
    drafts = tokens[:, 1:] != PLACEHOLDER_TOKEN_ID  # [B, K]
    return torch.cumprod(drafts.to(torch.int64), dim=1).sum(dim=1)


__all__ = ["DecodeInputs", "PendingDrafts", "valid_drafts"]
