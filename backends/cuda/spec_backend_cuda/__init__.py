"""CUDA backend for spec-backend (distribution ``spec-backend-cuda``).

Implemented here: availability probe, token limits and the memory-based capture-size policy. The
attention op, CUDA-graph runner and triton sampler ops arrive with the CUDA backend work and raise
``BackendNotImplementedError`` until then, so nothing silently falls back to another backend.
"""

from __future__ import annotations

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

#: Largest capture size when device memory is unknown (vLLM's default ceiling as well).
DEFAULT_MAX_CAPTURE_SIZE = 512
#: Tokens of capture size allowed per GiB of free device memory (graph pools grow with batch tokens).
CAPTURE_TOKENS_PER_GIB = 64


def memory_capped_capture_size(free_bytes: int | None) -> int:
    """Cap the largest capture size by free device memory: 64 tokens per free GiB, within [16, 512]."""
    if free_bytes is None:
        return DEFAULT_MAX_CAPTURE_SIZE
    by_memory = (free_bytes // (1 << 30)) * CAPTURE_TOKENS_PER_GIB
    return max(16, min(DEFAULT_MAX_CAPTURE_SIZE, by_memory))


class CudaBackend(Backend):
    """NVIDIA GPUs through CUDA: flash-attn/SDPA attention, CUDA graphs, triton sampler kernels."""

    name = "cuda"
    device_type = "cuda"

    def probe(self) -> Availability:
        try:
            if importlib.util.find_spec("triton") is None:
                return Availability(False, "triton is not installed (pip install spec-backend-cuda)")
            if not torch.cuda.is_available():
                built = torch.version.cuda
                why = "torch was built without CUDA" if built is None else "no CUDA device is visible"
                return Availability(False, f"{why} (torch {torch.__version__})")
        except Exception as exc:  # a probe reports, it never raises
            return Availability(False, f"CUDA probe failed: {type(exc).__name__}: {exc}")
        return Availability(True)

    def token_limits(self) -> TokenLimits:
        return TokenLimits(max_query_tokens_per_request=None)

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
        return CapturePolicy(max_capture_size=memory_capped_capture_size(free), graph_budget=None)

    def graph_runner(self, fn: Callable[..., torch.Tensor], capture_sizes: Sequence[int]) -> GraphRunner:
        raise BackendNotImplementedError(self.name, "the CUDA graph runner")

    def attention_function(self) -> AttentionFn:
        raise BackendNotImplementedError(self.name, "the attention function")

    def sampler_ops(self) -> SamplerOps:
        raise BackendNotImplementedError(self.name, "the sampler ops")

    def sampler_tuning(self) -> SamplerTuning:
        return SamplerTuning(vocab_block=4096, max_grid=None, device_uniforms=True)


__all__ = ["CudaBackend", "memory_capped_capture_size"]
