"""Lightweight target/draft model, parallel and load configurations (no vLLM, no transformers import).

They carry only what speculative-decoding validation needs. ``hf_config`` is the model's Hugging Face
``config.json`` as a plain dict (e.g. ``AutoConfig.from_pretrained(path).to_dict()``); the engine and
the vLLM integration fill these from the real objects.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ModelConfigLite(BaseModel):
    """What speculative decoding needs to know about a target or draft model.

    * ``model``: path or hub name.
    * ``max_model_len``: context length (``None``: unknown, length rules are skipped).
    * ``vocab_size``: vocabulary size; when ``None`` it is read from ``hf_config`` (or its ``text_config``).
    * ``hf_config``: the Hugging Face config as a dict (``model_type``, ``architectures``,
      ``num_nextn_predict_layers``, ``n_predict``, ``eagle_aux_hidden_state_layer_ids``, ...).
    * ``quantization``, ``dtype``, ``revision``, ``enforce_eager``: as for the target model.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_model_len: int | None = Field(default=None, ge=1)
    vocab_size: int | None = Field(default=None, ge=1)
    hf_config: dict[str, Any] = Field(default_factory=dict)
    quantization: str | None = None
    dtype: str | None = None
    revision: str | None = None
    enforce_eager: bool = False

    @property
    def hf_text_config(self) -> dict[str, Any]:
        """The text part of ``hf_config`` (its ``text_config`` for multimodal models, else itself)."""
        text = self.hf_config.get("text_config")
        return text if isinstance(text, dict) else self.hf_config

    @property
    def model_type(self) -> str:
        """``model_type`` of the text config, ``""`` when unknown."""
        value = self.hf_text_config.get("model_type", self.hf_config.get("model_type"))
        return value if isinstance(value, str) else ""

    def get_vocab_size(self) -> int | None:
        """``vocab_size`` if set, else the (text) ``hf_config``'s ``vocab_size``; ``None`` if unknown."""
        if self.vocab_size is not None:
            return self.vocab_size
        for cfg in (self.hf_text_config, self.hf_config):
            value = cfg.get("vocab_size")
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None


class ParallelConfigLite(BaseModel):
    """Parallel layout of a model: tensor and pipeline parallel degrees, executor backend."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    distributed_executor_backend: str | None = None
    disable_custom_all_reduce: bool = False


class LoadConfigLite(BaseModel):
    """How to load draft weights (defaults to the target's load settings when not given)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    load_format: str = "auto"
    download_dir: str | None = None
    model_loader_extra_config: dict[str, Any] = Field(default_factory=dict)
    ignore_patterns: list[str] | None = None


__all__ = ["LoadConfigLite", "ModelConfigLite", "ParallelConfigLite"]
