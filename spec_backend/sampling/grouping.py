"""Verifying a batch in groups of whole requests, for devices where a smaller working set is faster.

The rejection sampler's work is independent per request: every random number is keyed by the request's
seed and positions (``spec_backend.sampling.rng``), and nothing mixes rows of different requests. So a
batch can be verified group by group, each group a run of consecutive requests, with exactly the same
output as one pass. A backend asks for it with ``SamplerTuning.group_elements``: on a CPU, one pass over
``[B·(K+1), V]`` streams every intermediate (probabilities, ratios, residuals) through DRAM, while groups
of a few million logits stay in cache.

Glossary: a *group* is ``[first, stop)`` in request order; its logits rows are each request's K target
rows followed by its bonus row (vLLM's layout, rebuilt with ``index_select`` whatever the input's layout).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata
from spec_backend.sampling.sampling_metadata import SamplingMetadata


@dataclass(frozen=True)
class Group:
    """One group's sampler inputs: ``first`` is its first request's index in the whole batch."""

    first: int
    metadata: SpecDecodeMetadata
    draft_probs: torch.Tensor | None  # [T_g, V]
    logits: torch.Tensor  # [T_g + B_g, V]
    sampling: SamplingMetadata


def request_groups(
    num_draft_tokens: list[int], vocab_size: int, group_elements: int
) -> list[tuple[int, int]]:
    """Consecutive ``(first, stop)`` runs whose logits (``Σ (K_i + 1) · V``) fit ``group_elements``.

    A request larger than the budget forms a group of its own; the groups cover every request once.
    """
    groups: list[tuple[int, int]] = []
    first, used = 0, 0
    for index, k in enumerate(num_draft_tokens):
        size = (k + 1) * vocab_size
        if index > first and used + size > group_elements:
            groups.append((first, index))
            first, used = index, 0
        used += size
    if num_draft_tokens:
        groups.append((first, len(num_draft_tokens)))
    return groups


def split_batch(
    metadata: SpecDecodeMetadata,
    draft_probs: torch.Tensor | None,  # [T, V]
    logits: torch.Tensor,  # [T + B, V]
    sampling: SamplingMetadata,
    seeds: torch.Tensor,  # [B] int64, already resolved (every request has its seed)
    positions: torch.Tensor,  # [B] int64
    group_elements: int,
) -> list[Group]:
    """The batch's groups; seeds are passed resolved so that unseeded requests keep one seed per call."""
    nums = metadata.num_draft_tokens
    rows = None if metadata.standard_layout else _standard_rows(metadata)  # [T + B] or None: identity
    starts = [0, *itertools.accumulate(nums)]  # first draft token of each request, and T
    groups = []
    for first, stop in request_groups(nums, logits.shape[1], group_elements):
        t0, t1 = starts[first], starts[stop]
        drafts = metadata.draft_token_ids[t0:t1]  # [T_g]
        sub = SpecDecodeMetadata.from_layout(drafts, nums[first:stop], metadata.max_draft_token_id)
        groups.append(
            Group(
                first=first,
                metadata=sub,
                draft_probs=None if draft_probs is None else draft_probs[t0:t1],
                logits=_rows(logits, rows, t0 + first, t1 + stop),
                sampling=SamplingMetadata(
                    temperature=sampling.temperature[first:stop],
                    top_k=sampling.top_k[first:stop],
                    top_p=sampling.top_p[first:stop],
                    seeds=seeds[first:stop],
                    positions=positions[first:stop],
                ),
            )
        )
    return groups


def merge_outputs(
    outputs: list[tuple[int, torch.Tensor]], batch: int, max_spec_len: int, device: torch.device
) -> torch.Tensor:  # [B, max_spec_len + 1] int32
    """Place each group's ``[B_g, K_g + 1]`` output at its requests' rows, padded with placeholders."""
    merged = torch.full((batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device)
    for first, out in outputs:
        merged[first : first + out.shape[0], : out.shape[1]] = out
    return merged


def _rows(logits: torch.Tensor, rows: torch.Tensor | None, start: int, stop: int) -> torch.Tensor:
    """Logits rows ``start:stop`` of the standard layout: a view when already laid out so, else a gather."""
    return logits[start:stop] if rows is None else logits.index_select(0, rows[start:stop])


def _standard_rows(metadata: SpecDecodeMetadata) -> torch.Tensor:  # [T + B] int64
    """For request i in order: its target rows, then its bonus row (identity in vLLM's own layout)."""
    assert metadata.request_index is not None
    device = metadata.target_logits_indices.device
    total = metadata.num_tokens
    req = metadata.request_index.to(device)  # [T]
    bonus_at = metadata.cu_num_draft_tokens.to(torch.int64) + torch.arange(
        metadata.batch_size, device=device, dtype=torch.int64
    )  # [B] the bonus row sits after the request's K targets and every earlier request's rows
    rows = torch.empty(total + metadata.batch_size, dtype=torch.int64, device=device)
    rows[torch.arange(total, device=device, dtype=torch.int64) + req] = metadata.target_logits_indices.to(
        torch.int64
    )
    rows[bonus_at] = metadata.bonus_logits_indices.to(torch.int64)
    return rows


__all__ = ["Group", "merge_outputs", "request_groups", "split_batch"]
