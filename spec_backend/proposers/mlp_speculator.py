"""``mlp_speculator``: IBM's MLPSpeculator heads drafting autoregressively (``proposers.heads``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from spec_backend.proposers.heads import HeadDrafter

if TYPE_CHECKING:
    from spec_backend.models.mlp_speculator import MLPSpeculator
    from spec_backend.proposers.contract import DrafterContext


class MLPSpeculatorDrafter(HeadDrafter):
    """Head ``i`` of the checkpoint drafts token ``i`` (``K <= n_predict``)."""

    def __init__(self, model: MLPSpeculator, k: int, probabilistic: bool) -> None:
        if k > model.n_predict:
            raise ValueError(
                f"num_speculative_tokens={k} exceeds the MLPSpeculator's n_predict={model.n_predict}"
            )
        self.model, self.num_speculative_tokens, self.probabilistic = model, k, probabilistic
        self.drafts_ahead = not probabilistic  # argmax drafts go ahead (``HeadDrafter.propose_ahead``)

    def start(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.to(self.model.dtype)  # [B, H]

    def head_step(
        self, i: int, state: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.step(i, state, tokens)


def build_mlp_speculator_drafter(ctx: DrafterContext) -> MLPSpeculatorDrafter:
    from spec_backend.models.mlp_speculator import load_mlp_speculator

    config, path = ctx.config, ctx.model_path("an MLPSpeculator folder")
    target: Any = ctx.target
    weight = target.get_output_embeddings().weight  # [V, H]
    model = load_mlp_speculator(path, int(weight.shape[1]), int(weight.shape[0]))
    model = model.to(device=weight.device, dtype=weight.dtype).eval()
    assert config.num_speculative_tokens is not None
    return MLPSpeculatorDrafter(model, config.num_speculative_tokens, config.uses_draft_probs)


__all__ = ["MLPSpeculatorDrafter", "build_mlp_speculator_drafter"]
