"""The embedded engine: a Hugging Face causal LM, a ragged KV cache and the speculative loop.

``LLM(model, speculative_config=..., additional_config=...)`` and ``LLM.generate(prompts, params)``
follow vLLM's offline API; see ``docs/usage.md``.
"""

from spec_backend.engine.llm import LLM
from spec_backend.engine.loader import ModelLoadError
from spec_backend.engine.params import CompletionOutput, RequestOutput, SamplingParams, SpecDecodeRequestStats

__all__ = [
    "LLM",
    "CompletionOutput",
    "ModelLoadError",
    "RequestOutput",
    "SamplingParams",
    "SpecDecodeRequestStats",
]
