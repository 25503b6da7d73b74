"""Attention parameters of captured ACLGraphs, and their update before every replay.

Why this exists: ``npu_fused_infer_attention_score`` takes its sequence lengths
(``actual_seq_lengths`` / ``actual_seq_lengths_kv``) as host integer lists that the operator's tiling
consumes when the kernel task is *issued*. A captured graph therefore freezes the lengths seen at
capture time. Replaying a FULL graph with new per-request lengths needs the captured attention
tasks re-issued with the new lengths first. torch_npu provides that surgery:

* at capture, each attention call is wrapped in ``torch.npu.graph_task_group_begin(stream)`` /
  ``handle = torch.npu.graph_task_group_end(stream)``, which names the kernel task inside the graph;
  it is preceded by an ``ExternalEvent`` wait (then reset) captured into the graph, so replay blocks
  until the host has updated that task;
* before a replay, on a side stream, ``torch.npu.graph_task_update_begin(stream, handle)``, the same
  ``.out`` call with the new lengths, ``torch.npu.graph_task_update_end(stream)`` rewrite the task in
  place, and ``event.record(stream)`` releases the graph's wait for it.

This module keeps, per capture size, the record of every attention task captured at that size
(:class:`CapturedAttention`) and performs the update (:func:`update_attention`). The graph runner
opens a capture scope with :func:`capture_scope`; the attention function asks :func:`active_capture`
whether it is being captured.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_backend_ascend.npu import npu_namespace, torch_npu_module


@dataclass
class CapturedAttention:
    """One attention kernel task inside a captured graph, with what is needed to re-issue it.

    ``call`` holds every keyword of the ``.out`` call except ``actual_seq_lengths_kv``, which is the
    per-step part. ``query_len`` is the (static) padded query length of every request and ``batch``
    the number of requests the captured call covers; ``max_kv_len`` bounds the kv lengths.
    """

    handle: Any
    event: Any
    call: dict[str, Any]
    workspace: torch.Tensor
    out: list[torch.Tensor]
    query_len: int
    batch: int
    max_kv_len: int
    #: a window ring's view (``RaggedAttentionMetadata.ring_margin``): its kv lengths are the step's
    #: capped at ``query_len + ring_margin``
    ring_margin: int | None = None


@dataclass
class CaptureRecord:
    """Attention tasks captured for one graph size; ``fresh`` is True once updated for the next replay."""

    size: int
    attentions: list[CapturedAttention] = field(default_factory=list)
    fresh: bool = False


_ACTIVE: list[CaptureRecord] = []


@contextmanager
def capture_scope(record: CaptureRecord) -> Iterator[CaptureRecord]:
    """Mark ``record`` as the graph being captured: attention calls register themselves in it."""
    _ACTIVE.append(record)
    try:
        yield record
    finally:
        _ACTIVE.pop()


def active_capture() -> CaptureRecord | None:
    """The record of the graph being captured right now, or ``None`` when running eagerly."""
    return _ACTIVE[-1] if _ACTIVE else None


def replay_kv_lengths(
    query_lens: Sequence[int], kv_lens: Sequence[int], query_len: int, batch: int, max_kv_len: int
) -> list[int]:
    """``actual_seq_lengths_kv`` for a replay covering ``len(query_lens)`` real requests.

    Every request is presented with ``query_len`` query rows (its padding rows included), so its kv
    length is shifted by the padding: ``kv - q + query_len`` keeps each real row at its true
    position under right-down causal masking. Requests added by padding the batch up to the captured
    size get ``query_len`` (they only see their own rows; their outputs are discarded).
    """
    if len(query_lens) != len(kv_lens):
        raise ValueError(f"query_lens has {len(query_lens)} entries but kv_lens has {len(kv_lens)}")
    if len(query_lens) > batch:
        raise ValueError(f"{len(query_lens)} requests do not fit a graph captured for {batch} requests")
    lengths = []
    for q, kv in zip(query_lens, kv_lens, strict=True):
        if not 0 <= q <= query_len or kv < q:
            raise ValueError(
                f"bad lengths for a graph with {query_len} query rows per request: q={q} kv={kv}"
            )
        shifted = kv - q + query_len
        if shifted > max_kv_len:
            raise ValueError(
                f"kv length {kv} exceeds the {max_kv_len - query_len + q} the graph was captured for"
            )
        lengths.append(shifted)
    return lengths + [query_len] * (batch - len(query_lens))


def _as_list(values: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(values, torch.Tensor):
        return [int(v) for v in values.tolist()]
    return [int(v) for v in values]


def update_attention(
    record: CaptureRecord,
    query_lens: Sequence[int] | torch.Tensor,
    kv_lens: Sequence[int] | torch.Tensor,
    stream: Any | None = None,
) -> None:
    """Re-issue every attention task of ``record`` with this step's lengths (before its replay)."""
    npu = npu_namespace()
    fia = torch_npu_module().npu_fused_infer_attention_score
    q_list, kv_list = _as_list(query_lens), _as_list(kv_lens)
    update_stream = stream if stream is not None else npu.current_stream()
    with npu.stream(update_stream):
        for task in record.attentions:
            margin = task.ring_margin
            kv_task = kv_list
            if margin is not None:  # a window ring's view
                kv_task = [min(kv, q + margin) for q, kv in zip(q_list, kv_list, strict=True)]
            lengths = replay_kv_lengths(q_list, kv_task, task.query_len, task.batch, task.max_kv_len)
            npu.graph_task_update_begin(update_stream, task.handle)
            fia.out(**task.call, actual_seq_lengths_kv=lengths, workspace=task.workspace, out=task.out)
            npu.graph_task_update_end(update_stream)
            task.event.record(update_stream)
    record.fresh = True
