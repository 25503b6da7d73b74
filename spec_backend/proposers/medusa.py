"""``medusa``: K heads read the target's last committed hidden state and draft K tokens in one pass.

Head ``i`` predicts the token ``i+1`` places after the bonus token from the post-norm hidden state of
the last committed token (a prefill's last prompt row, or a decode step's row of its last accepted
draft). The heads do not see earlier drafts, so each draft's distribution ``q_i`` is the head's own:
sampled drafts with those probabilities keep probabilistic verification lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from spec_backend.proposers.contract import DraftInputs, DraftOutput, last_committed_rows
from spec_backend.proposers.heads import HeadDrafter
from spec_backend.proposers.sibling_draws import sampled_siblings, static_tree_output
from spec_backend.proposers.tree_build import depths_of, fill_static_batch

if TYPE_CHECKING:
    from spec_backend.models.medusa import MedusaHeads
    from spec_backend.proposers.contract import DrafterContext


class MedusaDrafter(HeadDrafter):
    """See the module docstring."""

    def __init__(self, heads: MedusaHeads, k: int, probabilistic: bool) -> None:
        if k > heads.num_heads:
            raise ValueError(
                f"num_speculative_tokens={k} exceeds the checkpoint's {heads.num_heads} Medusa heads"
            )
        self.heads, self.num_speculative_tokens, self.probabilistic = heads, k, probabilistic
        self.drafts_ahead = not probabilistic  # argmax drafts go ahead (``HeadDrafter.propose_ahead``)

    def start(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.to(next(self.heads.parameters()).dtype)  # [B, H]

    def head_step(
        self, i: int, state: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return state, self.heads.head_logits(i, state)  # the heads do not read earlier drafts

    @torch.inference_mode()
    def propose_tree(self, inputs: DraftInputs, parents: Sequence[int], ranks: Sequence[int]) -> DraftOutput:
        """A static tree: a node at depth ``d`` takes its rank among head ``d - 1``'s tokens (Medusa's own
        tree drafting: the heads do not see the drafts before them)."""
        final = inputs.target.final  # [N, H]
        if final is None:
            raise RuntimeError("the target returned no final hidden states for MedusaDrafter")
        state = self.start(final[last_committed_rows(inputs)])  # [B, H]
        depths, heads = depths_of(parents), self.heads
        logits = [heads.head_logits(i, state).float() for i in range(max(depths, default=0))]  # each [B, V]
        siblings = sampled_siblings(inputs.requests, self.probabilistic)
        tokens = fill_static_batch(parents, ranks, lambda p, _: logits[depths[p] if p >= 0 else 0], siblings)
        return static_tree_output(tokens, parents, ranks, siblings)


def build_medusa_drafter(ctx: DrafterContext) -> MedusaDrafter:
    from spec_backend.models.medusa import load_medusa

    config, path = ctx.config, ctx.model_path("a Medusa checkpoint folder")
    target: Any = ctx.target
    weight = target.get_output_embeddings().weight  # [V, H]
    heads = load_medusa(path, int(weight.shape[1]), int(weight.shape[0]))
    heads = heads.to(device=weight.device, dtype=weight.dtype).eval()
    assert config.num_speculative_tokens is not None
    return MedusaDrafter(heads, config.num_speculative_tokens, config.uses_draft_probs)


__all__ = ["MedusaDrafter", "build_medusa_drafter"]
