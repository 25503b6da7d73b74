"""The adapter between the engine's ``Drafter`` contract and the model-free host proposers (``ngram``,
``ngram_gpu``, ``suffix``: ``proposers.base.Proposer``), whose algorithms it leaves unchanged."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spec_backend.proposers.base import Proposer
from spec_backend.proposers.contract import (
    Drafter,
    DraftInputs,
    DraftOutput,
    DraftRequest,
    FlightTokens,
    pack_drafts,
)
from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID


class HostDrafter(Drafter):
    """Adapter for the model-free host proposers (``Proposer``): their algorithms are unchanged.

    It feeds each request's appended tokens to ``Proposer.update``, asks ``Proposer.propose`` for the
    budgets, and packs the lists. A proposer failure is isolated by retrying request by request.
    """

    defers_follow = True  # a host proposer's state is its requests' tokens

    def __init__(self, proposer: Proposer, device: torch.device) -> None:
        self.proposer = proposer
        self.num_speculative_tokens = proposer.num_speculative_tokens
        self.device = device
        # a proposer that drafts on the device is not shadowed: each shadow would cost a copy to the host
        self.can_shadow = type(proposer).propose_on_device is Proposer.propose_on_device
        self.drafts_ahead = type(proposer).propose_ahead is not Proposer.propose_ahead

    def add_request(self, request: DraftRequest) -> None:
        self.proposer.add_request(request.request_id, list(request.prompt_token_ids))

    def remove_request(self, request_id: str) -> None:
        self.proposer.remove_request(request_id)

    def _update(self, inputs: DraftInputs) -> tuple[list[str], list[str | None]]:
        """Feed each request's appended tokens; the ids and per-request failures."""
        ids = [r.request_id for r in inputs.requests]
        return ids, self._feed(inputs.requests, inputs.accepted.new_token_ids)

    def take_tokens(
        self, requests: Sequence[DraftRequest], new_token_ids: Sequence[list[int]]
    ) -> tuple[str | None, ...]:
        return tuple(self._feed(requests, new_token_ids))

    def _feed(self, requests: Sequence[DraftRequest], new_token_ids: Sequence[list[int]]) -> list[str | None]:
        """``Proposer.update`` with each request's new tokens; the per-request failures."""
        errors: list[str | None] = [None] * len(requests)
        for b, (request, tokens) in enumerate(zip(requests, new_token_ids, strict=True)):
            if not tokens:
                continue
            try:
                self.proposer.update(request.request_id, list(tokens))
            except Exception as exc:
                errors[b] = f"proposer failed: {type(exc).__name__}: {exc}"
        return errors

    def follow(self, inputs: DraftInputs) -> tuple[str | None, ...] | None:
        """The proposer sees each request's appended tokens; nothing is looked up or packed (a host
        proposer's state is its requests' tokens, and ``propose`` only reads it)."""
        return tuple(self._update(inputs)[1])

    def propose_tree(self, inputs: DraftInputs, parents: Sequence[int], ranks: Sequence[int]) -> DraftOutput:
        """Each request's subtree of the static tree that its proposer finds (``Proposer.propose_tree``);
        none where the budget is 0."""
        ids, errors = self._update(inputs)
        shapes: list[tuple[int, ...]] = []
        drafts: list[list[int]] = []
        for b, request_id in enumerate(ids):
            shape: tuple[int, ...] = ()
            tokens: list[int] = []
            if errors[b] is None and inputs.budgets[b] > 0:
                try:
                    shape, tokens = self.proposer.propose_tree(request_id, parents, ranks)
                except Exception as exc:
                    errors[b] = f"proposer failed: {type(exc).__name__}: {exc}"
            shapes.append(shape)
            drafts.append([int(t) for t in tokens])
        return DraftOutput(
            token_ids=pack_drafts(drafts, len(parents), self.device),
            num_draft_tokens=tuple(len(d) for d in drafts),
            errors=tuple(errors),
            tree_parents=tuple(shapes),
        )

    def shadow(self, inputs: DraftInputs) -> tuple[list[list[int]], tuple[str | None, ...]] | None:
        """The proposer's lookups, on the host and unpacked; ``None`` for a proposer that drafts on the
        device (each shadow would cost a copy to the host)."""
        if not self.can_shadow:
            return None
        ids, errors = self._update(inputs)
        return self._lookup(inputs, ids, errors), tuple(errors)

    def propose(self, inputs: DraftInputs) -> DraftOutput:
        ids, errors = self._update(inputs)
        on_device = self._on_device(inputs, ids, errors)
        if on_device is not None:
            return on_device
        drafts = self._lookup(inputs, ids, errors)
        return DraftOutput(
            token_ids=pack_drafts(drafts, self.num_speculative_tokens, self.device),
            num_draft_tokens=tuple(len(d) for d in drafts),
            errors=tuple(errors),
        )

    def _lookup(self, inputs: DraftInputs, ids: list[str], errors: list[str | None]) -> list[list[int]]:
        """Each request's drafts within its budget (a failing request's error is written to ``errors``)."""
        live = [b for b in range(len(ids)) if errors[b] is None and inputs.budgets[b] > 0]
        drafts: list[list[int]] = [[] for _ in ids]
        try:
            got = self.proposer.propose([ids[b] for b in live], max_tokens=[inputs.budgets[b] for b in live])
            for b, draft in zip(live, got, strict=True):
                drafts[b] = list(draft)
        except Exception:  # isolate the failing request(s)
            for b in live:
                try:
                    drafts[b] = list(self.proposer.propose([ids[b]], max_tokens=[inputs.budgets[b]])[0])
                except Exception as exc:
                    errors[b] = f"proposer failed: {type(exc).__name__}: {exc}"
        return [[int(t) for t in d[: inputs.budgets[b]]] for b, d in enumerate(drafts)]

    def _on_device(self, inputs: DraftInputs, ids: list[str], errors: list[str | None]) -> DraftOutput | None:
        """A device proposer's drafts without a host copy: each request gets its budget of draft rows,
        placeholders past its match (the step verifies those rows; its one host read counts the real
        drafts). ``None`` for a host proposer, or when a request failed to update (isolated on the host)."""
        if any(e is not None for e in errors):
            return None
        found = self.proposer.propose_on_device(ids, list(inputs.budgets))
        if found is None:
            return None
        drafts, counts = found  # [B, K], [B]
        keep = torch.arange(drafts.shape[1], device=drafts.device)[None, :] < counts[:, None]  # [B, K]
        drafts = drafts.to(torch.int64)
        token_ids = torch.where(keep, drafts, torch.full_like(drafts, PLACEHOLDER_TOKEN_ID))  # [B, K]
        return DraftOutput(token_ids, tuple(int(b) for b in inputs.budgets), errors=tuple(errors))

    def propose_ahead(
        self, requests: Sequence[DraftRequest], flight: FlightTokens, budgets: Sequence[int]
    ) -> torch.Tensor:  # [B, K] int64, placeholders past each match
        ids = [r.request_id for r in requests]
        found = self.proposer.propose_ahead(ids, flight.emitted, flight.counts, budgets)
        if found is None:
            name = type(self.proposer).__name__
            raise NotImplementedError(f"{name} drafts on the host (drafts_ahead is False)")
        drafts, found_counts = found  # [B, K], [B]
        keep = torch.arange(drafts.shape[1], device=drafts.device)[None, :] < found_counts[:, None]  # [B, K]
        drafts = drafts.to(torch.int64)
        return torch.where(keep, drafts, torch.full_like(drafts, PLACEHOLDER_TOKEN_ID))


__all__ = ["HostDrafter"]
