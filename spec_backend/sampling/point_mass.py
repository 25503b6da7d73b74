"""The sampler's fused path for point-mass drafts: when it applies, and the call.

Glossary: *point-mass drafts* are draft tokens without draft probabilities (``draft_probs=None``: q is 1
at the draft and 0 elsewhere). For them the rules whose ``VerifyRule.point_mass`` is set decide from p(x)
alone, so an ops with ``PointMassOps`` verifies the whole batch without writing the [N, V] probabilities
(one read of the logits, then the residual race over the final rows only) instead of composing softmax,
scan and residual race (see ``triton_kernels_fused``).
"""

from __future__ import annotations

from typing import cast

import torch

from spec_backend.sampling.metadata import SamplingMetadata, SpecDecodeMetadata
from spec_backend.sampling.ops import PointMassOps, SamplerOps
from spec_backend.verify_rules import VerifyRule


def point_mass_output(
    ops: SamplerOps,
    rule: VerifyRule,
    metadata: SpecDecodeMetadata,
    draft_probs: torch.Tensor | None,  # [T, V]
    logits: torch.Tensor,  # [T + B, V]
    sampling: SamplingMetadata,
    seeds: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64
) -> torch.Tensor | None:  # [B, max_spec_len + 1] int32, or None: compose the SamplerOps
    """The fused output where the rule, the inputs and the ops allow it; None otherwise."""
    if rule.point_mass is None or draft_probs is not None or sampling.apply_top_k or sampling.apply_top_p:
        return None
    # getattr, not isinstance: since Python 3.12 a runtime protocol check reads attributes statically,
    # which proxies of an ops object (forwarding through __getattr__) do not satisfy
    fuses = getattr(ops, "fuses_point_mass", None)
    if fuses is None or not fuses():
        return None
    fused = cast(PointMassOps, ops)
    assert metadata.request_index is not None and metadata.slot_index is not None
    layout = (
        metadata.draft_token_ids,
        metadata.target_logits_indices,
        metadata.bonus_logits_indices,
        metadata.request_index,
        metadata.slot_index,
        metadata.cu_num_draft_tokens,
    )
    return fused.point_mass_sample(
        logits, layout, sampling.temperature, seeds, positions, metadata.max_spec_len, rule.point_mass,
        not sampling.all_greedy,
    )  # fmt: skip


__all__ = ["point_mass_output"]
