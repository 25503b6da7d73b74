"""The engine's speculative config: the user's value plus what the checkpoints on disk say.

As vLLM does, the target's and the draft's ``config.json`` take part in validation: they infer the
method from the draft checkpoint (name patterns, ``model_type``, ``architectures``, the ``speculators``
format), default ``num_speculative_tokens`` from ``n_predict``/``num_nextn_predict_layers`` or the
speculators proposal, and point ``method="mtp"`` at the target's own checkpoint.
"""

from __future__ import annotations

import os
from typing import Any

from spec_backend.config import SpeculativeConfig
from spec_backend.config.json_input import json_object
from spec_backend.runtime.checkpoint_files import read_json_config
from spec_backend.runtime.sources import ModelSource


def parse_speculative_config(value: Any, target: ModelSource | None = None) -> SpeculativeConfig | None:
    """``None``, a ``SpeculativeConfig``, a dict or a JSON object string → a validated config.

    A dict or JSON string is completed with ``target_model_config`` (from ``target``'s ``config.json``)
    and ``draft_model_config`` (from the draft folder's ``config.json``) unless it gives them.
    """
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        if not value.strip():
            return None
        value = json_object(value)
    if not isinstance(value, dict):
        raise ValueError(
            f"speculative_config must be a dict, a JSON string or a SpeculativeConfig, got {value!r}"
        )
    data = dict(value)
    target_hf = None
    if target is not None and target.gguf_file is None:  # a config.json that does not parse is named
        target_hf = read_json_config(target.directory, "model folder")
    if target is not None and target_hf is not None and "target_model_config" not in data:
        data["target_model_config"] = {"model": target.directory, "hf_config": target_hf}
    model = data.get("model")
    draft_hf = None
    if isinstance(model, str) and os.path.isdir(model):
        draft_hf = read_json_config(model, "speculative_config['model'] folder")
    same = (
        target is not None
        and isinstance(model, str)
        and os.path.abspath(model) == os.path.abspath(target.directory)
    )
    if draft_hf is not None and not same and "draft_model_config" not in data:
        data["draft_model_config"] = {"model": model, "hf_config": draft_hf}
    return SpeculativeConfig.model_validate(data)


__all__ = ["parse_speculative_config"]
