"""The batch of a captured step, built on the device: every shape static, every index a device op
(``static_step_batch``), and the host's plan of a replay launched ahead over device lengths
(``host_plan``). Used inside captured callables (``runtime/captured.py``, ``proposers/captured_head.py``)
and by steps launched ahead (``engine/spec_ahead.py``)."""

from __future__ import annotations

import torch

from spec_backend.step import RaggedAttentionMetadata, StepBatch


def static_step_batch(
    input_ids: torch.Tensor,  # [N] = [B * q] int64
    seq_lens: torch.Tensor,  # [B] each request's seq len after this step (padding requests: 0)
    q: int,
    capacity: int,  # the cache's positions per slot: the width attention reads in a captured step
) -> StepBatch:
    """A captured step's batch: ``q`` query tokens per request from slot 0, every shape static, every
    index a device op (nothing read from the host). Padding requests take positions ``0 .. q-1`` of their
    (free) slots."""
    b, device = seq_lens.shape[0], input_ids.device
    lens = torch.clamp(seq_lens, min=q)  # [B]
    rows = torch.arange(b, device=device).repeat_interleave(q)  # [N]
    cols = torch.arange(q, device=device).repeat(b)  # [N]
    q_lens = torch.full((b,), q, dtype=torch.int64, device=device)  # [B]
    return StepBatch(
        start=0,
        slot_ids=torch.arange(b, device=device),
        input_ids=input_ids,
        positions=lens[rows] - q + cols,
        query_start_loc=torch.arange(b + 1, device=device) * q,
        query_lens=q_lens,
        seq_lens=lens,
        rows=rows,
        cols=cols,
        query_lens_host=(q,) * b,
        num_draft_tokens=(q - 1,) * b,
        max_seq_len=capacity,
        draft_token_ids=input_ids.new_zeros(0, dtype=torch.int32),
        attention=RaggedAttentionMetadata(query_lens=q_lens, kv_lens=lens),
        static_shapes=True,
    )


def host_plan(
    plans: dict[int, StepBatch], batch: int, q: int, capacity: int, device: torch.device
) -> StepBatch:
    """The host's plan of a replay launched ahead over device lengths: ``q`` rows per request for
    ``batch`` requests from slot 0 (what ``RaggedKVCache.begin_step`` reserves), its tensors a placeholder
    layout; made once per batch size and kept in ``plans``."""
    plan = plans.get(batch)
    if plan is None:
        zeros = torch.zeros(batch * q, dtype=torch.int64, device=device)  # [N]
        lens = torch.full((batch,), q, dtype=torch.int64, device=device)  # [B]
        plan = plans[batch] = static_step_batch(zeros, lens, q, capacity)
    return plan


__all__ = ["host_plan", "static_step_batch"]
