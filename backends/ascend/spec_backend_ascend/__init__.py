"""Ascend NPU backend for spec-backend (distribution ``spec-backend-ascend``).

Implemented here: an import-safe availability probe, the fused-attention token limit (K+1 ≤ 16 query
tokens per request per step) and the stream-budgeted capture-size policy. Attention, the ACLGraph
runner and the triton-ascend sampler ops arrive with the Ascend backend work and raise
``BackendNotImplementedError`` until then.

Nothing here imports ``torch_npu`` at module import time: only ``probe()`` tries, and turns any failure
(for example CANN's ``libhccl.so`` missing) into ``unavailable: <reason>``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from spec_backend.backends.base import (
    AttentionFn,
    Availability,
    Backend,
    BackendNotImplementedError,
    CapturePolicy,
    GraphRunner,
    SamplerTuning,
    TokenLimits,
)

if TYPE_CHECKING:
    from spec_backend.sampling.ops import SamplerOps

#: npu_fused_infer_attention_score handles at most 16 query tokens per request in decode (K+1 ≤ 16).
MAX_QUERY_TOKENS_PER_REQUEST = 16
#: Hardware streams usable for captured graphs (each graph takes one stream per layer plus one).
GRAPH_STREAM_BUDGET = 1800
#: Layers assumed when the model is not known yet.
DEFAULT_NUM_LAYERS = 32
#: Largest capture size in tokens.
MAX_CAPTURE_SIZE = 512


def stream_graph_budget(num_hidden_layers: int) -> int:
    """How many graphs fit in the stream budget when each needs ``num_hidden_layers + 1`` streams."""
    if num_hidden_layers < 1:
        raise ValueError(f"num_hidden_layers must be >= 1, got {num_hidden_layers}")
    return max(1, GRAPH_STREAM_BUDGET // (num_hidden_layers + 1))


class AscendBackend(Backend):
    """Huawei Ascend NPUs through torch_npu: fused attention, ACLGraph, triton-ascend sampler kernels."""

    name = "ascend"
    device_type = "npu"

    def probe(self) -> Availability:
        if importlib.util.find_spec("torch_npu") is None:
            return Availability(
                False, "torch_npu is not installed (needs CANN; pip install spec-backend-ascend[npu])"
            )
        try:
            importlib.import_module("torch_npu")
        except BaseException as exc:  # e.g. OSError: libhccl.so missing; report, never raise
            return Availability(False, f"torch_npu failed to import: {type(exc).__name__}: {exc}")
        npu = getattr(torch, "npu", None)
        if npu is None or not npu.is_available():
            return Availability(False, "torch_npu imported but no NPU device is visible")
        return Availability(True)

    def token_limits(self) -> TokenLimits:
        return TokenLimits(max_query_tokens_per_request=MAX_QUERY_TOKENS_PER_REQUEST)

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        budget = stream_graph_budget(num_hidden_layers or DEFAULT_NUM_LAYERS)
        return CapturePolicy(max_capture_size=MAX_CAPTURE_SIZE, graph_budget=budget)

    def graph_runner(self, fn: Callable[..., torch.Tensor], capture_sizes: Sequence[int]) -> GraphRunner:
        raise BackendNotImplementedError(self.name, "the ACLGraph runner")

    def attention_function(self) -> AttentionFn:
        raise BackendNotImplementedError(self.name, "the fused attention function")

    def sampler_ops(self) -> SamplerOps:
        raise BackendNotImplementedError(self.name, "the sampler ops")

    def sampler_tuning(self) -> SamplerTuning:
        # Grid capped at the vector-core count; no float64 random on the device: uniforms are passed in.
        return SamplerTuning(vocab_block=2048, max_grid=40, device_uniforms=False)


__all__ = ["MAX_QUERY_TOKENS_PER_REQUEST", "AscendBackend", "stream_graph_budget"]
