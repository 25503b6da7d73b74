"""The proposer (drafter) interface shared by every drafting method.

A proposer keeps per-request state keyed by a request id. The engine calls, once per step:

1. :meth:`Proposer.update` with the tokens appended to each running request's output in the last step
   (the accepted draft tokens followed by the recovered or bonus token);
2. :meth:`Proposer.propose` for the requests of the next step, which returns ragged draft token lists.

Requests join with :meth:`Proposer.add_request` (their prompt) and leave with
:meth:`Proposer.remove_request` (finished or aborted).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from spec_backend.config import SpeculativeConfig

__all__ = ["Proposer", "draft_limits", "speculative_tokens"]


class Proposer(ABC):
    """Abstract drafter: per-request history in, ragged draft token lists out."""

    #: K, the most draft tokens proposed per request per step.
    num_speculative_tokens: int

    @abstractmethod
    def add_request(self, req_id: str, prompt_token_ids: Sequence[int]) -> None:
        """Start tracking ``req_id`` with its prompt; re-adding an existing id replaces it."""

    @abstractmethod
    def update(self, req_id: str, new_token_ids: Sequence[int]) -> None:
        """Append the tokens added to ``req_id``'s output this step (accepted + recovered/bonus)."""

    @abstractmethod
    def remove_request(self, req_id: str) -> None:
        """Forget ``req_id`` (finished or aborted); unknown ids are ignored."""

    @abstractmethod
    def propose(self, req_ids: Sequence[str], max_tokens: Sequence[int] | None = None) -> list[list[int]]:
        """Draft tokens for each request, in order.

        Entry ``i`` has at most ``min(K, max_tokens[i])`` tokens; ``[]`` when there is nothing to propose.
        """

    def propose_tree(
        self, req_id: str, parents: Sequence[int], ranks: Sequence[int]
    ) -> tuple[tuple[int, ...], list[int]]:
        """The nodes of a static token tree (``proposers.tree_build``) this proposer finds for
        ``req_id``: the parents (renumbered) and tokens of the subtree whose nodes exist, in the plan's
        order. Default: only chains."""
        del req_id, parents, ranks
        raise NotImplementedError(f"{type(self).__name__} drafts chains, not token trees")

    def propose_on_device(
        self, req_ids: Sequence[str], max_tokens: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The drafts ``[B, K]`` and their counts ``[B]`` left on the proposer's device (no host copy),
        for proposers that compute on a device; ``None`` (the default): only ``propose``'s host lists."""
        del req_ids, max_tokens
        return None

    def propose_ahead(
        self,
        req_ids: Sequence[str],
        emitted: torch.Tensor,  # [B, W] int64 on the device: a step's emitted tokens, padding after them
        counts: torch.Tensor,  # [B] int64 on the device: each request's emitted tokens
        max_tokens: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor] | None:  # drafts [B, K], counts [B]
        """``propose_on_device`` after each request's ``counts[b]`` tokens of ``emitted`` (a step the host
        has not landed), which each request's next ``update`` then brings; ``None`` (the default): a
        proposer that drafts on the host cannot."""
        del req_ids, emitted, counts, max_tokens
        return None


def draft_limits(num_speculative_tokens: int, num_reqs: int, max_tokens: Sequence[int] | None) -> list[int]:
    """Per-request draft budget ``min(K, max_tokens[i])`` (clamped at 0); ``K`` for all without a cap."""
    if max_tokens is None:
        return [num_speculative_tokens] * num_reqs
    if len(max_tokens) != num_reqs:
        raise ValueError(f"max_tokens has {len(max_tokens)} entries for {num_reqs} requests")
    return [max(0, min(num_speculative_tokens, int(m))) for m in max_tokens]


def speculative_tokens(config: SpeculativeConfig) -> int:
    """K of a validated config; ``ValueError`` naming the method when it is unset."""
    if config.num_speculative_tokens is None:
        raise ValueError(f"num_speculative_tokens is required for speculative method {config.method!r}")
    return config.num_speculative_tokens
