"""Drafts waiting for the next decode step, one row per cache slot (draft-next runs at the end of a step).

A ``SlotCache``: the slot table moves and frees these rows with every other cache, so a step takes its
drafts as the slice ``[start : start + B]`` instead of gathering them per request. Draft ids live on the
device; the counts (how many of a row's ids the next step verifies) are host values, cut at each
request's budget when stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spec_backend.engine.request import Request
from spec_backend.proposers.contract import DraftOutput
from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID


@dataclass(frozen=True)
class DecodeInputs:
    """One decode step's query tokens ``[B, 1 + K_max]``, draft counts and draft probabilities."""

    tokens: torch.Tensor  # [B, 1 + K_max] int64, placeholders past each count
    counts: list[int]  # host [B]
    probs: torch.Tensor | None  # [B, K_max, V] float32 (zeros where a request has none)
    #: token trees: per request its nodes' parents (``DraftOutput.tree_parents``), cut at its count
    parents: list[tuple[int, ...]] | None = None

    def row(self, i: int) -> DecodeInputs:
        """Request ``i``'s inputs alone (every field: a retry must not drop its tree)."""
        probs = self.probs[i : i + 1] if self.probs is not None else None
        parents = self.parents[i : i + 1] if self.parents is not None else None
        return DecodeInputs(self.tokens[i : i + 1], self.counts[i : i + 1], probs, parents)


class PendingDrafts:
    """The drafts of every live slot (module docstring), validated against the budgets and vocabulary."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity, self.device = capacity, device
        self.ids = torch.full((capacity, 0), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)  # [S, K]
        self.probs: torch.Tensor | None = None  # [S, K, V] float32, from the first drafts with probabilities
        self._counts: list[int] = []  # host, per live slot
        self._with_probs: list[bool] = []
        self._parents: list[tuple[int, ...]] = []  # host, per live slot: its tree's parents (or none)

    # -- SlotCache -----------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return len(self._counts)

    def add_slot(self) -> int:
        self._counts.append(0)
        self._with_probs.append(False)
        self._parents.append(())
        return len(self._counts) - 1

    def move_slot(self, src: int, dst: int) -> None:
        self._counts[dst], self._with_probs[dst] = self._counts[src], self._with_probs[src]
        self._parents[dst] = self._parents[src]
        self.ids[dst] = self.ids[src]
        if self.probs is not None:
            self.probs[dst] = self.probs[src]

    def pop_slot(self) -> None:
        self._counts.pop()
        self._with_probs.pop()
        self._parents.pop()

    def reset(self) -> None:
        self._counts.clear()
        self._with_probs.clear()
        self._parents.clear()

    @property
    def total(self) -> int:
        """Drafts held for the next step, over every live slot."""
        return sum(self._counts)

    # -- the engine ----------------------------------------------------------------------------------
    def counts(self, start: int, batch: int) -> list[int]:
        """The draft counts held for slots ``start .. start + batch - 1`` (``restore`` puts them back)."""
        return self._counts[start : start + batch]

    def restore(self, start: int, counts: list[int]) -> None:
        """Hold ``counts`` again for the slots from ``start`` (a step that took them failed before it ran:
        its drafts, still in their rows, are verified by the step that retries it)."""
        self._counts[start : start + len(counts)] = counts

    def store(self, start: int, out: DraftOutput, budgets: Sequence[int], vocab_size: int) -> None:
        """Keep ``out``'s drafts for slots ``start ..``; a count is cut at its budget. From the first id
        outside [0, V) on, ids become placeholders on the device (no read back): the sampler ends that
        request's drafts there, as if the count had been cut, and the step counts only the valid ones
        (``valid_drafts``)."""
        ids = out.token_ids  # [B, K]
        batch, width = len(budgets), ids.shape[1]
        valid = torch.cumprod(((ids >= 0) & (ids < vocab_size)).to(torch.int64), dim=1).bool()  # [B, K]
        self._ensure_width(width)
        self.ids[start : start + batch, :width] = torch.where(
            valid, ids, torch.full_like(ids, PLACEHOLDER_TOKEN_ID)
        )
        if out.draft_probs is not None:  # [B, K, V]
            if self.probs is None or self.probs.shape[2] != out.draft_probs.shape[2]:
                self.probs = out.draft_probs.new_zeros(
                    (self.capacity, self.ids.shape[1], out.draft_probs.shape[2])
                )
            self.probs[start : start + batch, :width] = out.draft_probs
        for b in range(batch):
            self._counts[start + b] = max(0, min(out.num_draft_tokens[b], budgets[b]))
            self._with_probs[start + b] = out.draft_probs is not None
            self._parents[start + b] = out.tree_parents[b] if out.tree_parents is not None else ()

    def take(self, start: int, requests: Sequence[Request], device: torch.device) -> DecodeInputs:
        """The decode inputs of the slots ``start ..`` holding ``requests`` (their drafts are consumed;
        finished requests feed no drafts)."""
        batch = len(requests)
        counts = [0 if r.finished else self._counts[start + b] for b, r in enumerate(requests)]
        self._counts[start : start + batch] = [0] * batch
        k_max = max(counts, default=0)
        parents = [self._parents[start + b][:c] for b, c in enumerate(counts)]
        last = torch.tensor([r.output_token_ids[-1] for r in requests], dtype=torch.int64).to(device)  # [B]
        if not k_max:
            return DecodeInputs(last[:, None], counts, None, parents)
        drafted = [start + b for b, c in enumerate(counts) if c]
        with_probs = [s for s in drafted if self._with_probs[s]]
        without = [s for s in drafted if not self._with_probs[s]]
        sampled_without = [s for s in without if requests[s - start].temperature > 0]
        if with_probs and sampled_without:
            # a greedy request's drafts may come without (a batch drafted for greedy requests only):
            # their rows are never read; a sampled one's must have them
            raise ValueError(
                f"a drafter returned draft probabilities for some sampled requests of a batch only "
                f"(slots {sampled_without} have none)"
            )
        ids = self.ids[start : start + batch, :k_max]  # [B, K]
        if min(counts) == k_max and not with_probs:  # every request verifies k_max: nothing to cut
            return DecodeInputs(torch.cat([last[:, None], ids], 1), counts, None, parents)
        keep = torch.tensor([[j < c for j in range(k_max)] for c in counts]).to(device)  # [B, K] bool
        tokens = torch.cat(
            [last[:, None], torch.where(keep, ids, torch.full_like(ids, PLACEHOLDER_TOKEN_ID))], 1
        )
        probs = None
        if with_probs:
            assert self.probs is not None
            rows = self.probs[start : start + batch, :k_max]  # [B, K, V]
            held = torch.tensor([self._with_probs[start + b] for b in range(batch)]).to(device)  # [B]
            probs = torch.where(keep[..., None] & held[:, None, None], rows, torch.zeros_like(rows))
        return DecodeInputs(tokens, counts, probs, parents)

    def _ensure_width(self, width: int) -> None:
        if width > self.ids.shape[1]:
            wider = torch.full(
                (self.capacity, width), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=self.device
            )
            wider[:, : self.ids.shape[1]] = self.ids
            if self.probs is not None:  # other slots' drafts keep their probabilities
                probs = self.probs.new_zeros((self.capacity, width, self.probs.shape[2]))
                probs[:, : self.probs.shape[1]] = self.probs
                self.probs = probs
            self.ids = wider


__all__ = ["DecodeInputs", "PendingDrafts"]
