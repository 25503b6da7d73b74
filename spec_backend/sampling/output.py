"""The sampler's output tensor: build it (device side) and parse it (host side, for metrics)."""

from __future__ import annotations

import torch

from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID


def build_output(
    draft_ids: torch.Tensor,  # [T] int
    cu_num_draft_tokens: torch.Tensor,  # [B]
    num_accepted: torch.Tensor,  # [B] int64
    final_tokens: torch.Tensor,  # [B] int64 recovered or bonus token
    max_spec_len: int,
) -> torch.Tensor:  # [B, max_spec_len + 1] int32
    """Row b: its accepted drafts, then the recovered / bonus token, then ``PLACEHOLDER_TOKEN_ID``."""
    from spec_backend.sampling.torch_ops import padded, request_layout

    index, valid, _ = request_layout(cu_num_draft_tokens, max_spec_len)  # [B, S]
    batch = num_accepted.shape[0]
    slots = torch.arange(max_spec_len + 1, device=num_accepted.device, dtype=torch.int64)[None, :]  # [1, S+1]
    drafts = padded(draft_ids.to(torch.int64), index, valid, PLACEHOLDER_TOKEN_ID)  # [B, S]
    drafts = torch.cat([drafts, drafts.new_full((batch, 1), PLACEHOLDER_TOKEN_ID)], dim=1)  # [B, S+1]
    n = num_accepted.to(torch.int64)[:, None]  # [B, 1]
    out = torch.where(slots < n, drafts, torch.full_like(drafts, PLACEHOLDER_TOKEN_ID))
    out = torch.where(slots == n, final_tokens.to(torch.int64)[:, None], out)
    return out.to(torch.int32)


def parse_output(
    output: torch.Tensor,  # [B, max_K + 1] int
    vocab_size: int | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Per-request emitted tokens and accepted-draft counts (host side; synchronises).

    Each row holds the accepted drafts, then one recovered or bonus token, then placeholders, so the
    accepted count is ``len(tokens) - 1``. With ``vocab_size``, ids outside [0, vocab_size) are dropped
    as well (mirrors vLLM's ``parse_output``).
    """
    if output.dim() != 2:
        raise ValueError(f"output must be 2-D [B, max_K + 1], got shape {list(output.shape)}")
    tokens: list[list[int]] = []
    for row in output.tolist():
        kept = [t for t in row if t != PLACEHOLDER_TOKEN_ID and (vocab_size is None or 0 <= t < vocab_size)]
        tokens.append(kept)
    accepted = [max(len(t) - 1, 0) for t in tokens]
    return tokens, accepted


__all__ = ["build_output", "parse_output"]
