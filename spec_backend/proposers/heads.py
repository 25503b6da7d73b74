"""Head drafters (``medusa``, ``mlp_speculator``): small heads on the last committed hidden state.

Both start from the target's post-norm hidden state of each request's last committed token and draft
K tokens by running head ``i`` for draft ``i``; they differ only in what a head step does:

* Medusa: head ``i`` maps the same hidden state to its logits (drafts do not see earlier drafts);
* MLPSpeculator: head ``i`` updates a running state with the previous token's embedding (the bonus
  token for the first head, then each draft).

Draft ``i`` is drawn from head ``i``'s distribution given everything the head saw, so sampled drafts
with those probabilities keep probabilistic verification lossless.

Argmax drafts go ahead too (``propose_ahead``, async speculative steps: ``engine/spec_ahead.py``): the
heads keep no state between steps, so the drafts after a step not landed yet come from its hidden state
at the bonus token's row (its accepted count) and its bonus token, both on the device.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import torch

from spec_backend.proposers.contract import (
    Drafter,
    DraftInputs,
    DraftOutput,
    DraftRequest,
    FlightTokens,
    empty_drafts,
    last_committed_rows,
)
from spec_backend.proposers.draft_sampling import DraftChain
from spec_backend.step import HiddenStateRequest


class HeadDrafter(Drafter):
    """See the module docstring. Subclasses define ``start`` and ``head_step``."""

    hidden_states = HiddenStateRequest(final=True)
    probabilistic: bool = False

    @abstractmethod
    def start(self, hidden: torch.Tensor) -> torch.Tensor:
        """The initial state from the last committed hidden states ``[B, H]``."""

    @abstractmethod
    def head_step(
        self, i: int, state: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Head ``i`` on ``state`` and the previous tokens ``[B]`` -> (next state, logits ``[B, V]``)."""

    def follow(self, inputs: DraftInputs) -> tuple[str | None, ...] | None:
        """Nothing to keep up with: the heads read only the step's hidden states."""
        return (None,) * len(inputs.requests)

    @torch.inference_mode()
    def propose_ahead(
        self, requests: Sequence[DraftRequest], flight: FlightTokens, budgets: Sequence[int]
    ) -> torch.Tensor:  # [B, K]
        """K argmax drafts per request after ``flight`` (module docstring; budgets are K there)."""
        final = flight.final  # [B, q, H]
        if final is None or self.probabilistic:
            raise RuntimeError(f"{type(self).__name__} drafts ahead from a step's hidden states, argmax only")
        tokens = flight.bonus  # [B]
        state, drafts = self.start(flight.at_bonus(final)), []  # from the hidden state [B, H] at its row
        for i in range(self.num_speculative_tokens):
            state, logits = self.head_step(i, state, tokens)
            tokens = logits.float().argmax(dim=-1)  # [B], as ``select_drafts`` draws argmax drafts
            drafts.append(tokens)
        return torch.stack(drafts, dim=1)

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        final = inputs.target.final  # [N, H]
        if final is None:
            raise RuntimeError(f"the target returned no final hidden states for {type(self).__name__}")
        k_max = max(inputs.budgets, default=0)
        if k_max == 0:
            return empty_drafts(len(inputs.requests), self.num_speculative_tokens, final.device)
        state = self.start(final[last_committed_rows(inputs)])  # [B, ...]
        newest = [r.output_token_ids[-1] if r.output_token_ids else 0 for r in inputs.requests]
        tokens = torch.tensor(newest, dtype=torch.int64).to(final.device)  # [B] the bonus tokens
        chain = DraftChain(inputs.requests, self.probabilistic, final.device)
        for i in range(k_max):
            state, logits = self.head_step(i, state, tokens)
            tokens = chain.draw(logits.float())
        return chain.output(inputs.budgets)


__all__ = ["HeadDrafter"]
