"""A fake ``torch_npu`` for CPU CI — test-only; put on ``sys.path`` by the ``fake_npu`` fixture alone.

Importing it installs ``torch.npu`` (like the real package does): ``is_available``, devices, streams,
``NPUGraph`` / ``graph`` / ``graph_pool_handle`` with real capture-replay semantics, the task-group
update API and ``ExternalEvent`` (see ``_graph``). Ops: ``npu_fused_infer_attention_score`` (and its
``.out`` variant and workspace query) validated against the documented signature (see ``_fia``),
and ``npu_top_k_top_p``. ``CALLS`` logs op calls, graph events and updates in order; ``reset()``
clears it.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from . import _fia, _graph
from ._graph import CALLS

__version__ = "0.0.0+fake"
FAKE = True


def _fia_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> Any:
    CALLS.append(("npu_fused_infer_attention_score", kwargs))
    return _graph.kernel(lambda: _fia.fused_infer_attention_score(query, key, value, **kwargs))


class _FusedInferAttentionScore:
    """``torch_npu.npu_fused_infer_attention_score`` with its ``.out`` overload."""

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> Any:
        return _fia_call(query, key, value, **kwargs)

    def out(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        workspace: torch.Tensor,
        out: list[torch.Tensor],
        **kwargs: Any,
    ) -> list[torch.Tensor]:
        if not isinstance(workspace, torch.Tensor):
            raise TypeError("npu_fused_infer_attention_score.out needs the workspace tensor")
        CALLS.append(("npu_fused_infer_attention_score.out", kwargs))

        def run() -> list[torch.Tensor]:
            result, lse = _fia.fused_infer_attention_score(query, key, value, **kwargs)
            if len(out) != 2 or out[0].shape != result.shape or out[0].dtype != result.dtype:
                raise RuntimeError(
                    f"out=[attention_out {tuple(result.shape)} {result.dtype}, softmax_lse] expected"
                )
            if out[1].shape != lse.shape:
                raise RuntimeError(f"softmax_lse out must have shape {tuple(lse.shape)}")
            out[0].copy_(result)
            out[1].copy_(lse)
            return out

        return _graph.kernel(run)  # type: ignore[no-any-return]


npu_fused_infer_attention_score = _FusedInferAttentionScore()


def _npu_fused_infer_attention_score_get_max_workspace(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any
) -> torch.Tensor:
    """Validates like the op (by running it on the arguments) and returns a workspace buffer."""
    CALLS.append(("get_max_workspace", kwargs))
    _graph.host_call(lambda: _fia.fused_infer_attention_score(query, key, value, **kwargs))
    return torch.empty(1 << 10, dtype=torch.uint8)


#: k range of npu_top_k_top_p (op-plugin docs torch_npu-npu_top_k_top_p.md: "值域为[1, 1024]")
TOP_K_MAX = 1024


def npu_top_k_top_p(
    logits: torch.Tensor, p: torch.Tensor | None = None, k: torch.Tensor | None = None
) -> torch.Tensor:
    """The documented rule (op-plugin docs, torch_npu-npu_top_k_top_p.md), on CPU.

    Sort ascending (stable); top-k masks every value below the k-th largest (ties at it are kept);
    softmax; top-p masks the values whose ascending cumulative probability is <= 1 - p, always keeping
    the largest; masked values become -inf. Validation as documented: logits 2-D float16/bfloat16/
    float32; k int32 [B] in [1, 1024] and <= V; p [B] in [0, 1] with the logits' dtype.
    """
    CALLS.append(("npu_top_k_top_p", None))
    rows, vocab = logits.shape[0], logits.shape[-1]
    if logits.dim() != 2 or logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise RuntimeError(f"npu_top_k_top_p: logits [B, V] float16/bfloat16/float32, got {logits.dtype}")
    if k is not None and (k.shape != (rows,) or k.dtype != torch.int32):
        raise RuntimeError(f"npu_top_k_top_p: k must be an int32 tensor [B], got {k.dtype} {tuple(k.shape)}")
    if k is not None and bool(((k < 1) | (k > min(TOP_K_MAX, vocab))).any()):
        raise RuntimeError(f"npu_top_k_top_p: k must lie in [1, 1024] and <= V={vocab}, got {k.tolist()}")
    if p is not None and (p.shape != (rows,) or p.dtype != logits.dtype):
        raise RuntimeError(f"npu_top_k_top_p: p must be [B] with the logits' dtype, got {p.dtype}")
    if p is not None and bool(((p < 0) | (p > 1)).any()):
        raise RuntimeError(f"npu_top_k_top_p: p must lie in [0, 1], got {p.tolist()}")
    values, order = logits.float().sort(dim=-1, descending=False, stable=True)  # ascending
    if k is not None:
        kth = values.gather(1, (vocab - k.long())[:, None])  # [B, 1] the k-th largest
        values = values.masked_fill(values < kth, float("-inf"))
    if p is not None:
        cumulative = torch.softmax(values, dim=-1).cumsum(dim=-1)  # from the smallest probability
        drop = cumulative <= 1 - p.float()[:, None]
        drop[:, -1] = False  # the largest is always kept
        values = values.masked_fill(drop, float("-inf"))
    kept = torch.zeros_like(values, dtype=torch.bool).scatter(1, order, values > float("-inf"))
    return logits.masked_fill(~kept, float("-inf"))


def npu_fusion_attention(*args: Any, **kwargs: Any) -> Any:
    """Exported by the real package (transformers imports it when torch_npu is present); not emulated."""
    raise NotImplementedError("fake torch_npu does not emulate npu_fusion_attention")


def reset() -> None:
    """Clear the call log."""
    CALLS.clear()


def _namespace() -> types.ModuleType:
    npu = types.ModuleType("torch_npu.npu")
    names = """NPUGraph graph graph_pool_handle is_current_stream_capturing graph_task_group_begin
    graph_task_group_end graph_task_update_begin graph_task_update_end Stream current_stream stream
    synchronize ExternalEvent"""
    for name in names.split():
        setattr(npu, name, getattr(_graph, name))
    npu.is_available = lambda: True  # type: ignore[attr-defined]
    npu.device_count = lambda: 1  # type: ignore[attr-defined]
    npu.current_device = lambda: 0  # type: ignore[attr-defined]
    npu.set_device = lambda device: None  # type: ignore[attr-defined]
    return npu


npu = _namespace()
sys.modules["torch_npu.npu"] = npu
torch.npu = npu  # type: ignore[attr-defined]
