"""CUDA backend for spec-backend (distribution ``spec-backend-cuda``).

* :mod:`spec_backend_cuda.backend` — :class:`CudaBackend` (probe, limits, capture policy, parts);
* :mod:`spec_backend_cuda.attention` — ragged attention: flash-attn with per-request cache lengths,
  else the reference SDPA;
* :mod:`spec_backend_cuda.graph_runner` — ``torch.cuda.CUDAGraph`` runner with padding to the next
  captured size;
* :mod:`spec_backend_cuda.limits` — the memory-based capture-size cap and the sampler tile size.

Importing this package imports torch but neither triton nor flash-attn (the probe stays cheap).
"""

from __future__ import annotations

from spec_backend_cuda.backend import CudaBackend
from spec_backend_cuda.limits import (
    CAPTURE_TOKENS_PER_GIB,
    DEFAULT_MAX_CAPTURE_SIZE,
    VOCAB_BLOCK,
    memory_capped_capture_size,
)

__all__ = [
    "CAPTURE_TOKENS_PER_GIB",
    "DEFAULT_MAX_CAPTURE_SIZE",
    "VOCAB_BLOCK",
    "CudaBackend",
    "memory_capped_capture_size",
]
