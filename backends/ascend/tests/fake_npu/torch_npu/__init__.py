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


def npu_top_k_top_p(
    logits: torch.Tensor, p: torch.Tensor | None = None, k: torch.Tensor | None = None
) -> torch.Tensor:
    """Mask logits outside each row's top-k, then outside its top-p nucleus, with -inf (vLLM's rule)."""
    CALLS.append(("npu_top_k_top_p", None))
    rows = logits.shape[0]
    if logits.dim() != 2 or logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise RuntimeError(f"npu_top_k_top_p: logits [B, V] float16/bfloat16/float32, got {logits.dtype}")
    if k is not None and (k.shape != (rows,) or k.dtype.is_floating_point or bool((k < 1).any())):
        raise RuntimeError("npu_top_k_top_p: k must be an integer tensor [B] with values >= 1")
    if p is not None and (p.shape != (rows,) or not p.dtype.is_floating_point):
        raise RuntimeError("npu_top_k_top_p: p must be a float tensor [B]")
    sorted_logits, order = logits.float().sort(dim=-1, descending=True)
    keep = torch.ones_like(sorted_logits, dtype=torch.bool)
    if k is not None:
        keep &= torch.arange(logits.shape[1])[None, :] < k[:, None].long()
    if p is not None:
        probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
        keep &= (probs.cumsum(-1) - probs) < p[:, None].float()
    keep[:, 0] = True
    mask = torch.zeros_like(keep).scatter(1, order, keep)
    return logits.masked_fill(~mask, float("-inf"))


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
