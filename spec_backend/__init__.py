"""spec-backend: speculative decoding for LLM inference on CUDA GPUs, Ascend NPUs and CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spec_backend.config import RejectionSamplerConfig, SpeculativeConfig
    from spec_backend.engine import LLM, SamplingParams

__version__ = "0.1.0"

__all__ = ["LLM", "RejectionSamplerConfig", "SamplingParams", "SpeculativeConfig", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: the engine pulls in transformers and the config torch; `spec-backend --help` needs neither.
    if name in ("RejectionSamplerConfig", "SpeculativeConfig"):
        import spec_backend.config as config

        return getattr(config, name)
    if name in ("LLM", "SamplingParams"):
        import spec_backend.engine as engine

        return getattr(engine, name)
    raise AttributeError(f"module 'spec_backend' has no attribute {name!r}")
