"""An EAGLE-style head's drafts after a step the host has not landed (``Drafter.propose_ahead``, async
speculative steps: ``engine/spec_ahead.py``), on a backend whose captured attention reads device lengths.

After a synchronous step the head rolls back to its committed rows and feeds this step's: the first query
row and one row per accepted draft, each pairing the target's features of that row with the next token
(the accepted draft after it, then the bonus token). Ahead, the accepted counts are on the device only, so
every request feeds all ``K+1`` of the step's rows (row ``i`` with emitted token ``i``; placeholders past
the bonus become token 0) at positions ``t - 1 ..`` for a request with ``t`` tokens before the step, one
replay of ``CapturedHeadStep.committed_ahead`` over device lengths. Draft 1 is the argmax of the head's
logits at the bonus token's row (row ``accepted``), drafts 2..K one replay of the greedy chain from there
(``chain_ahead``). Rows past the bonus's are masked by each request's lengths and rewritten by its next
step, as are the chain's. Causal attention keeps the rows the synchronous step feeds exactly as it feeds
them, so the drafts are its drafts (tests compare in float64; in lower precision the wider batch may move
a near-tie, which never changes a greedy token and leaves sampled ones distributed as the target's).

The host's cache lengths hold an upper bound until the step lands (``landed``): each request's cache then
holds its committed rows (its tokens but the newest) and the chain's K-1 rows, as after the synchronous
draft-next.

Glossary: *committed rows* — rows fed with the target's features, one per token but the newest (the head
cache's ``_rows``); *chain* — drafts 2..K drawn by feeding each draft back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from spec_backend.models.chain_head import ChainHead
    from spec_backend.proposers.captured_head import CapturedHeadStep
    from spec_backend.proposers.contract import DraftRequest, FlightTokens


class HeadAhead:
    """Drafting ahead for ``head`` over its captured ``step`` (module docstring); ``final``: the head reads
    the target's final hidden state, else its auxiliary layers."""

    def __init__(self, head: ChainHead, step: CapturedHeadStep, final: bool) -> None:
        if step.committed_graph is None or step.chain_graph is None:
            raise ValueError("drafting ahead replays the committed rows and the chain over device lengths")
        self.head, self.step, self.final = head, step, final

    @torch.no_grad()
    def propose(self, flight: FlightTokens) -> torch.Tensor:  # [B, K] int64
        """Every request's K drafts after ``flight``'s tokens (module docstring)."""
        features = flight.final if self.final else flight.aux  # [B, q, H] or [B, q, n_aux, H]
        if features is None:
            raise RuntimeError("the step in flight recorded no hidden states for the draft head")
        batch, q = features.shape[0], features.shape[1]
        if q != self.step.rows:
            raise ValueError(f"the head's committed graph feeds {self.step.rows} rows a request, got {q}")
        rows_h = self.head.combine(features.reshape(batch * q, -1)).view(batch, q, -1)  # [B, q, H]
        ids = flight.emitted.clamp(min=0)  # [B, q] row i's next token (placeholders past the bonus: 0)
        out = self.step.committed_ahead(ids, rows_h, flight.before - 1 + q)  # [B, q, H]
        last = flight.at_bonus(out)  # [B, H] the bonus token's row
        first = self.head.argmax_draft(last, 0)  # [B]
        rest = self.step.chain_ahead(first, last, flight.before + flight.counts)  # [B, K-1]
        return torch.cat([first[:, None], rest], dim=1)

    def landed(self, requests: Sequence[DraftRequest | None]) -> list[tuple[int, str, int, int]]:
        """The step drafted after landed: each live slot's ``(slot, request id, committed rows, cache
        length)``: its tokens but the newest, and the chain's rows after them."""
        chain = self.step.chain
        return [
            (slot, r.request_id, r.num_tokens - 1, r.num_tokens - 1 + chain)
            for slot, r in enumerate(requests)
            if r is not None
        ]


__all__ = ["HeadAhead"]
