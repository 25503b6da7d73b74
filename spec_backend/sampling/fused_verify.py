"""The sampler's fused verification: when it applies, and the call.

Glossary: *point-mass drafts* are draft tokens without draft probabilities (``draft_probs=None``: q is 1
at the draft and 0 elsewhere). The rules whose ``VerifyRule.fused`` is set decide from per-draft scalars
(p(x), and q(x) when drafts carry probabilities), so an ops with ``FusedVerifyOps`` verifies the whole
batch without writing the [N, V] target probabilities (one read of the logits, then the residual race
over the final rows only) instead of composing softmax, scan and residual race (see
``triton.fused``): the token-level rule with or without draft probabilities, the lossless block
rule for point-mass drafts (with draft probabilities its residual masses need whole rows).
"""

from __future__ import annotations

from typing import cast

import torch

from spec_backend.sampling.metadata import SpecDecodeMetadata
from spec_backend.sampling.ops import FusedVerifyOps, SamplerOps
from spec_backend.sampling.sampling_metadata import SamplingMetadata
from spec_backend.verify_rules import VerifyRule


def fused_output(
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
    if rule.fused is None or sampling.apply_top_k or sampling.apply_top_p:
        return None
    if draft_probs is not None and rule.fused != "token":  # block: residual masses need whole q rows
        return None
    # getattr, not isinstance: since Python 3.12 a runtime protocol check reads attributes statically,
    # which proxies of an ops object (forwarding through __getattr__) do not satisfy
    fuses = getattr(ops, "fuses_verify", None)
    if fuses is None or not fuses():
        return None
    fused = cast(FusedVerifyOps, ops)
    assert metadata.request_index is not None and metadata.slot_index is not None
    layout = (
        metadata.draft_token_ids,
        metadata.target_logits_indices,
        metadata.bonus_logits_indices,
        metadata.request_index,
        metadata.slot_index,
        metadata.cu_num_draft_tokens,
    )
    return fused.fused_verify(
        logits, draft_probs, layout, sampling.temperature, seeds, positions, metadata.max_spec_len,
        rule.fused, not sampling.all_greedy,
    )  # fmt: skip


__all__ = ["fused_output"]
