"""spec-backend: speculative decoding for LLM inference on CUDA GPUs, Ascend NPUs and CPU."""

from __future__ import annotations

from typing import Any

from spec_backend.config import RejectionSamplerConfig

__version__ = "0.1.0"

__all__ = ["LLM", "RejectionSamplerConfig", "SamplingParams", "SpeculativeConfig", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: the engine pulls in transformers; the config models are cheap but live in their own module.
    if name == "SpeculativeConfig":
        from spec_backend.config import SpeculativeConfig

        return SpeculativeConfig
    if name in ("LLM", "SamplingParams"):
        import spec_backend.engine as engine

        return getattr(engine, name)
    raise AttributeError(f"module 'spec_backend' has no attribute {name!r}")
