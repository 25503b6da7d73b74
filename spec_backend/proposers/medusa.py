"""``medusa``: K heads read the target's last committed hidden state and draft K tokens in one pass.

Head ``i`` predicts the token ``i+1`` places after the bonus token from the post-norm hidden state of
the last committed token (a prefill's last prompt row, or a decode step's row of its last accepted
draft). The heads do not see earlier drafts, so each draft's distribution ``q_i`` is the head's own:
sampled drafts with those probabilities keep probabilistic verification lossless.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from spec_backend.proposers.contract import Drafter, DraftInputs, DraftOutput, HiddenStateRequest
from spec_backend.proposers.draft_sampling import select_drafts

if TYPE_CHECKING:
    from spec_backend.models.medusa import MedusaHeads
    from spec_backend.proposers.registry import DrafterContext


class MedusaDrafter(Drafter):
    """See the module docstring."""

    hidden_states = HiddenStateRequest(final=True)

    def __init__(self, heads: MedusaHeads, k: int, probabilistic: bool) -> None:
        if k > heads.num_heads:
            raise ValueError(
                f"num_speculative_tokens={k} exceeds the checkpoint's {heads.num_heads} Medusa heads"
            )
        self.heads, self.num_speculative_tokens, self.probabilistic = heads, k, probabilistic

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        final = inputs.target.final  # [N, H]
        if final is None:
            raise RuntimeError("the target returned no final hidden states for the Medusa drafter")
        batch = inputs.batch
        last = (
            batch.query_start_loc[1:] - 1
            if inputs.accepted.is_prefill
            else batch.query_start_loc[:-1]
            + torch.tensor(inputs.accepted.num_accepted, dtype=torch.int64).to(final.device)
        )
        k_max = max(inputs.budgets, default=0)
        if k_max == 0:
            empty = torch.full(
                (len(inputs.requests), self.num_speculative_tokens),
                -1,
                dtype=torch.int64,
                device=final.device,
            )
            return DraftOutput(empty, (0,) * len(inputs.requests))
        logits = self.heads(final[last].to(next(self.heads.parameters()).dtype), k_max).float()  # [B, K, V]
        positions = torch.tensor([r.num_tokens for r in inputs.requests], dtype=torch.int64).to(final.device)
        drafts, probs = [], []
        for i in range(k_max):
            ids, q = select_drafts(logits[:, i], inputs.requests, positions, i, self.probabilistic)
            drafts.append(ids)
            if q is not None:
                probs.append(q)
        return DraftOutput(
            token_ids=torch.stack(drafts, dim=1),
            num_draft_tokens=tuple(min(b, k_max) for b in inputs.budgets),
            draft_probs=torch.stack(probs, dim=1) if probs else None,
        )


def build_medusa_drafter(ctx: DrafterContext) -> MedusaDrafter:
    from spec_backend.models.medusa import load_medusa

    config = ctx.config
    if config.model is None:
        raise ValueError("method='medusa' needs speculative_config['model'] (a Medusa checkpoint folder)")
    target: Any = ctx.target
    weight = target.get_output_embeddings().weight  # [V, H]
    heads = load_medusa(config.model, int(weight.shape[1]), int(weight.shape[0]))
    heads = heads.to(device=weight.device, dtype=weight.dtype).eval()
    assert config.num_speculative_tokens is not None
    return MedusaDrafter(heads, config.num_speculative_tokens, config.uses_draft_probs)


__all__ = ["MedusaDrafter", "build_medusa_drafter"]
