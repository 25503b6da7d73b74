"""A draft model's drafts after a step the host has not landed (``Drafter.propose_ahead``, async
speculative steps: ``engine/spec_ahead.py``), on a backend whose captured attention reads device lengths.

After a synchronous step the draft model rolls its cache back to the drafts the step accepted and feeds
the tokens the cache lacks: the bonus token, and the last draft too where every draft was accepted (it was
drafted, never fed). Ahead, the counts are on the device only, so every request feeds two rows, the token
before the bonus and the bonus, at their positions: the first is either the last accepted draft or the
step's first query token, whose row the cache holds already (the same token at the same position: the
same keys), or the last draft, which it lacks. Draft 1 is the argmax after the bonus token, drafts 2..K
one replay of the greedy chain (``CapturedChain.forward_ahead``). Rows written past a request's tokens are
masked by its lengths and rewritten by its next step. The host's cache lengths hold an upper bound until
the step lands (``landed``): then each request's cache holds its tokens and its K-1 fed drafts, as after
the synchronous draft-next. The drafts are the synchronous ones where the two computations agree (in
float64, tests); in lower precision a near-tie between two tokens could draft the other one, which never
changes a greedy token and leaves sampled ones distributed as the target's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from spec_backend.proposers.contract import DraftRequest, FlightTokens
    from spec_backend.runtime.captured import CapturedChain, CapturedDecode


class DraftAhead:
    """The two-row catch-up step (``pair``: captured at two tokens per request over device lengths) and
    the greedy ``chain`` of drafts 2..K of a draft model (module docstring)."""

    def __init__(self, pair: CapturedDecode, chain: CapturedChain) -> None:
        if pair.q != 2 or not pair.device_lengths:
            raise ValueError(f"drafting ahead feeds two rows over device lengths, got q={pair.q}")
        self.pair, self.chain = pair, chain

    @torch.no_grad()
    def propose(self, flight: FlightTokens) -> torch.Tensor:  # [B, K] int64
        """Every request's K drafts after ``flight``'s tokens (module docstring)."""
        batch, accepted, bonus = flight.counts.shape[0], flight.accepted, flight.bonus  # [B] each
        last_accepted = flight.emitted.gather(1, (accepted - 1).clamp(min=0)[:, None]).squeeze(1)  # [B]
        before = torch.where(accepted > 0, last_accepted, flight.fed)  # [B] the token before the bonus
        ids = torch.stack([before, bonus], dim=1).reshape(-1)  # [B * 2]
        after = flight.before + flight.counts  # [B] each request's tokens after the step, all fed now
        _, out = self.pair.forward_ahead(ids, after)
        first = out.logits.view(batch, 2, -1)[:, 1].argmax(dim=-1)  # [B] draft 1, after the bonus
        rest = self.chain.forward_ahead(first, after + 1)  # [B, K-1]
        return torch.cat([first[:, None], rest], dim=1)

    def landed(self, requests: Sequence[DraftRequest | None]) -> list[tuple[int, int]]:
        """The step drafted after landed: each live slot's exact cache length (its tokens and the K-1 fed
        drafts) as ``(slot, length)``."""
        fed = self.chain.chain
        return [(slot, r.num_tokens + fed) for slot, r in enumerate(requests) if r is not None]


__all__ = ["DraftAhead"]
