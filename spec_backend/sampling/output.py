"""The sampler's output tensor: build it (device side) and parse it (host side, for metrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID

if TYPE_CHECKING:
    from spec_backend.sampling.ops import SamplerOps
    from spec_backend.sampling.sampling_metadata import SamplingMetadata


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


def row_target_probs(
    ops: SamplerOps,
    logits: torch.Tensor,  # [N, V]
    sampling: SamplingMetadata,
    row_req: torch.Tensor,  # [N] int64: the request of each row
) -> torch.Tensor:  # [N, V]
    """Each row's target distribution with its request's temperature, top-k and top-p."""
    return ops.target_probs(
        logits,
        sampling.temperature[row_req],
        sampling.top_k[row_req],
        sampling.top_p[row_req],
        sampling.apply_top_k,
        sampling.apply_top_p,
        max_top_k=sampling.max_top_k,
    )


def bonus_only(
    ops: SamplerOps,
    bonus_rows: torch.Tensor,  # [B] logits row of each request
    logits: torch.Tensor,  # [B, V]
    sampling: SamplingMetadata,
    seeds: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64
) -> torch.Tensor:  # [B, 1] int32
    """The output of a batch without drafts (plain decoding): each request's bonus token, from the same
    ops calls, on the same rows and random numbers, as ``RejectionSampler._verify_batch`` makes for it
    (argmax for greedy rows, the residual race with no draft to remove for sampled ones), without the
    draft layout a verification builds."""
    rows = bonus_rows.to(torch.int64)  # [B]
    batch = rows.shape[0]
    argmax = None if sampling.all_random else ops.argmax(logits)  # [N]
    final = torch.zeros(batch, dtype=torch.int64, device=logits.device)  # [B]
    if not sampling.all_greedy:
        arange = torch.arange(batch, device=logits.device)
        row_req = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device).scatter(
            0, rows, arange
        )
        probs = row_target_probs(ops, logits, sampling, row_req)  # [N, V]
        no_draft = torch.full_like(rows, -1)  # [B] q = 0: nothing to remove from the target
        scale = torch.ones(batch, dtype=torch.float64, device=logits.device)  # [B]
        empty = torch.zeros(0, dtype=torch.int32, device=logits.device)  # [T = 0]
        final = ops.sample_residual(probs, rows, None, empty, no_draft, scale, seeds, positions)
        if argmax is not None:
            final = torch.where(sampling.temperature == 0, argmax[rows], final)
    elif argmax is not None:
        final = argmax[rows]
    return final.to(torch.int32)[:, None]


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
