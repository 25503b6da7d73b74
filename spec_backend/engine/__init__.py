"""The embedded engine: a Hugging Face causal LM, a ragged KV cache and the speculative loop.

``LLM(model, speculative_config=..., additional_config=...)`` and ``LLM.generate(prompts, params)``
follow vLLM's offline API; see ``docs/usage.md``. The names below are imported on first use, so the
command line can list the engine's subcommands without importing torch or transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec_backend.lazy import lazy_attributes

if TYPE_CHECKING:
    from spec_backend.engine.llm import LLM
    from spec_backend.engine.params import (
        CompletionOutput,
        RequestMetrics,
        RequestOutput,
        SamplingParams,
        SpecDecodeRequestStats,
    )
    from spec_backend.engine.structured import StructuredOutputsParams
    from spec_backend.runtime.checkpoint_files import ModelLoadError

_LAZY = {
    "LLM": "spec_backend.engine.llm",
    "ModelLoadError": "spec_backend.runtime.checkpoint_files",
    "CompletionOutput": "spec_backend.engine.params",
    "RequestMetrics": "spec_backend.engine.params",
    "RequestOutput": "spec_backend.engine.params",
    "SamplingParams": "spec_backend.engine.params",
    "SpecDecodeRequestStats": "spec_backend.engine.params",
    "StructuredOutputsParams": "spec_backend.engine.structured",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "LLM",
    "CompletionOutput",
    "ModelLoadError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "SpecDecodeRequestStats",
    "StructuredOutputsParams",
]
