"""Speculative method names, their inference from a draft model, and the MTP config overrides.

The names follow vLLM's ``speculative_config.method`` so existing configurations carry over:

* model-free drafters: ``ngram`` (alias ``[ngram]``), ``ngram_gpu``, ``suffix``;
* draft-model based: ``draft_model`` (a small LM with the target's vocabulary), ``medusa``,
  ``mlp_speculator``, the EAGLE family ``eagle``, ``eagle3``, ``dflash``, ``dspark``, ``mtp`` and
  ``extract_hidden_states``;
* per-architecture MTP names (``deepseek_mtp``, ``qwen3_next_mtp``, ...) are accepted but deprecated:
  they are mapped to ``mtp`` with a warning.
"""

from __future__ import annotations

import copy
import difflib
import logging
from typing import Any, Final, Literal, cast

from spec_backend.methods import ALIASES, DEPRECATED_ALIASES, METHODS, MTP_MODEL_TYPES, accepted_names

logger = logging.getLogger("spec_backend.config")

#: Methods whose drafter runs on the target's hidden states (EAGLE-style), from the method table.
EAGLE_METHODS: Final[tuple[str, ...]] = tuple(n for n, m in METHODS.items() if m.family == "eagle")

#: Methods that return auxiliary hidden states from the target (changes the target's graph).
AUX_HIDDEN_STATE_METHODS: Final[tuple[str, ...]] = tuple(n for n, m in METHODS.items() if m.aux_hidden_states)

#: Target model types that can expose auxiliary hidden states (substring match, as in vLLM).
AUX_HIDDEN_STATES_SUPPORTED: Final[tuple[str, ...]] = (
    "llama",
    "qwen",
    "minicpm",
    "gpt_oss",
    "hunyuan_vl",
    "hunyuan_v1_dense",
    "afmoe",
    "nemotron_h",
    "deepseek_v2",
    "deepseek_v3",
    "kimi_k2",
    "kimi_k25",
    "minimax_m2",
    "gemma4",
)


#: Every accepted value of ``method`` (before normalisation): the table's names and their aliases.
SPECULATIVE_METHODS: Final[tuple[str, ...]] = accepted_names()

#: Methods that need no draft weights: ``model`` is set to the method name.
MODEL_FREE_METHODS: Final[tuple[str, ...]] = tuple(n for n, m in METHODS.items() if m.model_free)

#: ``SPECULATIVE_METHODS`` written out for the type checker, which cannot derive a ``Literal`` from the
#: table; ``tests/unit/test_method_table.py`` holds the two equal, in order.
SpeculativeMethod = Literal[
    "ngram",
    "[ngram]",
    "ngram_gpu",
    "suffix",
    "draft_model",
    "medusa",
    "mlp_speculator",
    "eagle",
    "eagle3",
    "dflash",
    "dspark",
    "extract_hidden_states",
    "deepseek_mtp",
    "mimo_mtp",
    "mimo_v2_mtp",
    "glm4_moe_mtp",
    "glm4_moe_lite_mtp",
    "glm_ocr_mtp",
    "ernie_mtp",
    "nemotron_h_mtp",
    "exaone_moe_mtp",
    "exaone4_5_mtp",
    "qwen3_next_mtp",
    "qwen3_5_mtp",
    "longcat_flash_mtp",
    "mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "hy_v3_mtp",
]


def check_method_name(value: Any) -> Any:
    """Reject an unknown ``method`` with the value received and the accepted names."""
    if value is None or (isinstance(value, str) and value in SPECULATIVE_METHODS):
        return value
    hint = ""
    if isinstance(value, str):
        close = difflib.get_close_matches(value, SPECULATIVE_METHODS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
        f"method={value!r} is not a known speculative method{hint}; allowed: {list(SPECULATIVE_METHODS)}"
    )


def normalize_method(method: SpeculativeMethod) -> SpeculativeMethod:
    """The method an alias names (``spec_backend.methods.ALIASES``: ``[ngram]`` -> ``ngram``, deprecated
    per-architecture MTP names -> ``mtp``, with a warning)."""
    target = ALIASES.get(method)
    if target is None:
        return method
    if method in DEPRECATED_ALIASES:
        logger.warning("speculative method %r is deprecated; it is replaced with %r", method, target)
    return cast(SpeculativeMethod, target)


def infer_method(model: str | None) -> SpeculativeMethod:
    """The method implied by ``model`` alone when ``method`` is not given."""
    return "ngram" if model in ("ngram", "[ngram]") else "draft_model"


def detect_draft_method(
    method: SpeculativeMethod, model: str, model_type: str, num_speculative_tokens: int | None
) -> SpeculativeMethod:
    """Refine ``method`` from the draft model's name and ``model_type`` (vLLM's detection order).

    Returns the detected method. An explicit EAGLE-family method is kept. A method that contradicts a
    *known* draft ``model_type`` raises ``ValueError``; with an unknown ``model_type`` (no draft config
    was given) the explicit method is trusted.
    """
    name = model.lower()
    if method in ("eagle", "eagle3", "dflash", "dspark"):
        return method
    if "eagle-" in name:
        return "eagle"
    if "eagle3" in name:
        return "eagle3"
    if "dspark" in name:
        return "dspark"
    if "dflash" in name:
        return "dflash"
    if model_type in ("medusa", "mlp_speculator"):
        return cast(SpeculativeMethod, model_type)
    if model_type in MTP_MODEL_TYPES:
        if num_speculative_tokens is not None and num_speculative_tokens > 1:
            logger.warning(
                "num_speculative_tokens=%d > 1 runs the same MTP layer several times per step, "
                "which may lower the acceptance rate",
                num_speculative_tokens,
            )
        return "mtp"
    if method == "draft_model" or not model_type:
        return method
    raise ValueError(
        f"method={method!r} does not match the draft model {model!r} whose model_type is {model_type!r}; "
        f"{method!r} needs a draft config with model_type "
        + (f"in {list(MTP_MODEL_TYPES)}" if method == "mtp" else repr(method))
        + ", or use method='draft_model'"
    )


#: ``speculators_model_type`` -> (method, parallel drafting)
_SPECULATORS_TYPES: Final[dict[str, tuple[SpeculativeMethod, bool]]] = {
    "eagle": ("eagle", False),
    "eagle3": ("eagle3", False),
    "peagle": ("eagle3", True),
    "dflash": ("dflash", True),
    "dspark": ("dspark", True),
    "mtp": ("mtp", False),
}

#: ``architectures[0]`` of draft checkpoints that are not plain causal LMs -> method
_DRAFT_ARCHITECTURES: Final[dict[str, SpeculativeMethod]] = {
    "LlamaForCausalLMEagle3": "eagle3",
    "Eagle3LlamaForCausalLM": "eagle3",
    "DFlashDraftModel": "dflash",
    "DFlash2DraftModel": "dflash",
    "Qwen3DSparkModel": "dspark",
}


def checkpoint_method(hf_config: dict[str, Any]) -> tuple[SpeculativeMethod | None, bool, int | None]:
    """(method, parallel drafting, K) a draft config declares itself: the ``speculators`` format
    (``speculators_model_type``, K from its first proposal method) or a known draft architecture."""
    kind = hf_config.get("speculators_model_type")
    if kind is None:
        method = _DRAFT_ARCHITECTURES.get(_first_architecture(hf_config))
        block = _int_or_none(hf_config.get("block_size")) if method == "dspark" else None
        return method, method == "dspark", block  # DeepSpec's DSpark drafts block_size tokens per block
    if kind not in _SPECULATORS_TYPES:
        raise ValueError(
            f"speculators_model_type={kind!r} is not supported; supported: {sorted(_SPECULATORS_TYPES)}"
        )
    method, parallel = _SPECULATORS_TYPES[kind]
    spec = hf_config.get("speculators_config")
    proposals = spec.get("proposal_methods") if isinstance(spec, dict) else None
    first = (
        proposals[0] if isinstance(proposals, list) and proposals and isinstance(proposals[0], dict) else {}
    )
    return method, parallel, _int_or_none(first.get("speculative_tokens"))


# --- MTP hf_config overrides (what vLLM's hf_config_override does, on plain dicts) -------------------

#: model_type of a full checkpoint -> model_type of its MTP drafter.
_MTP_BY_MODEL_TYPE: Final[dict[str, str]] = {
    "deepseek_v3": "deepseek_mtp",
    "deepseek_v32": "deepseek_mtp",
    "glm_moe_dsa": "deepseek_mtp",
    "pangu_ultra_moe": "pangu_ultra_moe_mtp",
    "ernie4_5_moe": "ernie_mtp",
    "qwen3_next": "qwen3_next_mtp",
    "exaone_moe": "exaone_moe_mtp",
    "qwen3_5": "qwen3_5_mtp",
    "qwen3_5_text": "qwen3_5_mtp",
    "qwen3_5_moe": "qwen3_5_mtp",
    "qwen3_5_moe_text": "qwen3_5_mtp",
    "longcat_flash": "longcat_flash_mtp",
    "step3p5": "step3p5_mtp",
    "hy_v3": "hy_v3_mtp",
}

#: architectures[0] of a full checkpoint -> (MTP model_type, whether the drafter keeps no decoder layers).
_MTP_BY_ARCHITECTURE: Final[dict[str, tuple[str, bool]]] = {
    "MiMoForCausalLM": ("mimo_mtp", True),
    "MiMoV2ProForCausalLM": ("mimo_v2_mtp", True),
    "MiMoV2OmniForCausalLM": ("mimo_v2_mtp", True),
    "MiMoV2FlashForCausalLM": ("mimo_v2_mtp", True),
    "Glm4MoeForCausalLM": ("glm4_moe_mtp", False),
    "Glm4MoeLiteForCausalLM": ("glm4_moe_lite_mtp", True),
    "GlmOcrForConditionalGeneration": ("glm_ocr_mtp", True),
}

#: MTP model types whose layer count defaults to 1 when the checkpoint does not say.
_ONE_LAYER_DEFAULT: Final[frozenset[str]] = frozenset(
    {"nemotron_h_mtp", "longcat_flash_mtp", "step3p5_mtp", "mimo_v2_mtp"}
)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _first_architecture(cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""


def mtp_hf_config_override(hf_config: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``hf_config`` rewritten as its MTP drafter's config, when it has one.

    A full checkpoint (e.g. ``model_type="deepseek_v3"``) becomes ``model_type="deepseek_mtp"`` with
    ``n_predict`` taken from ``num_nextn_predict_layers`` (``mtp_num_hidden_layers`` for Qwen3.5). Other
    configs are returned unchanged. Idempotent.
    """
    cfg = copy.deepcopy(hf_config)
    arch = _first_architecture(cfg)
    if arch == "NemotronH_Super_Omni_Reasoning_V3" and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]  # the VLM's text config carries the MTP layers
        arch = _first_architecture(cfg)
    raw_type = cfg.get("model_type")
    model_type: str = raw_type if isinstance(raw_type, str) else ""
    nextn = _int_or_none(cfg.get("num_nextn_predict_layers"))
    new_type: str | None = _MTP_BY_MODEL_TYPE.get(model_type)
    no_layers = False
    if arch in _MTP_BY_ARCHITECTURE:
        new_type, no_layers = _MTP_BY_ARCHITECTURE[arch]
    elif "exaone4_5" in model_type:
        new_type = "exaone4_5_mtp"
    elif model_type in ("nemotron_h", "nemotron_h_puzzle") and nextn is not None and nextn > 0:
        new_type = "nemotron_h_mtp"
    elif new_type is None and model_type in MTP_MODEL_TYPES and model_type != "mtp":
        new_type = model_type
    if new_type is None:
        return cfg
    if new_type == "qwen3_5_mtp":
        n_predict = _int_or_none(cfg.get("mtp_num_hidden_layers"))
    elif new_type == "mimo_v2_mtp":
        n_predict = 1  # only the first MiMo-V2 MTP layer is used
    else:
        n_predict = nextn if nextn is not None else (1 if new_type in _ONE_LAYER_DEFAULT else None)
    cfg["model_type"] = new_type
    if n_predict is not None or "n_predict" not in cfg:
        cfg["n_predict"] = n_predict
    if no_layers:
        cfg["num_hidden_layers"] = 0
    return cfg


__all__ = [
    "AUX_HIDDEN_STATES_SUPPORTED",
    "AUX_HIDDEN_STATE_METHODS",
    "EAGLE_METHODS",
    "MODEL_FREE_METHODS",
    "MTP_MODEL_TYPES",
    "SPECULATIVE_METHODS",
    "SpeculativeMethod",
    "check_method_name",
    "checkpoint_method",
    "detect_draft_method",
    "infer_method",
    "mtp_hf_config_override",
    "normalize_method",
]
