"""spec-backend: speculative decoding for LLM inference on CUDA GPUs, Ascend NPUs and CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec_backend.lazy import lazy_attributes

if TYPE_CHECKING:
    from spec_backend.config import RejectionSamplerConfig, SpeculativeConfig
    from spec_backend.engine import LLM, SamplingParams, StructuredOutputsParams

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "RejectionSamplerConfig",
    "SamplingParams",
    "SpeculativeConfig",
    "StructuredOutputsParams",
    "__version__",
]

# Lazy: the engine pulls in transformers and torch, the config pydantic; `spec-backend --help` needs none.
__getattr__ = lazy_attributes(
    __name__,
    {
        "RejectionSamplerConfig": "spec_backend.config",
        "SpeculativeConfig": "spec_backend.config",
        "LLM": "spec_backend.engine",
        "SamplingParams": "spec_backend.engine",
        "StructuredOutputsParams": "spec_backend.engine",
    },
)
