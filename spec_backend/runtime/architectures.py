"""Which decoder architectures the engine runs, and the refusal, at load, of those it cannot.

The engine's KV cache holds keys and values per position (``runtime.kv_cache``) and its attention
computes causal attention over them, full or in a sliding window (``backends.attention``). A model runs
when every decoder layer is one of ``ATTENTION_LAYER_TYPES`` as transformers itself resolves them
(``cache_utils.get_layer_types_and_kwargs``: ``layer_types``, or a sliding window / attention chunk in the
config), and the layers that slide hand their window to the attention function (``sliding_window=``).
Multi-head latent attention (DeepSeek-V2/V3 style, ``kv_lora_rank``) runs as well: transformers caches the
compressed latent and its rotary key (``runtime.kv_cache.kv_layout`` sizes the cache for them) and expands
them into per-head keys and values before calling the attention function.

Linear-attention layers whose mixer ``runtime.mixers`` knows (Gated DeltaNet: Qwen3-Next, Qwen3.5;
Mamba-2: Bamba, Granite-4.0-H, Nemotron-H) run in a target model: their conv window and recurrent state
live per slot beside the KV cache and roll back with it (``runtime.recurrent_state``); a draft model with
them is refused.

Everything else is refused by ``check_architecture`` with the architecture and what the engine lacks:
other recurrent or convolution state (Mamba-1, Jamba, other linear attention), chunked local
attention, layers that reuse another layer's cache, sparse attention with an indexer, bidirectional
attention. A refusal here is a ``ModelLoadError`` raised by ``LLM(...)``, before any forward.
"""

from __future__ import annotations

import inspect
from typing import Any

from spec_backend.runtime.checkpoint_files import ModelLoadError

#: decoder layer types the engine's ragged attention computes
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")

#: what a layer type needs that the engine lacks (layer types transformers resolves)
MISSING_FOR_LAYER_TYPE = {
    "linear_attention": "linear-attention / state-space (recurrent) state in the cache, rolled back on "
    "rejected drafts",
    "conv": "convolution state in the cache, rolled back on rejected drafts",
    "hybrid": "recurrent state beside the KV cache in one layer",
    "hybrid_sliding": "recurrent state beside the KV cache in one layer",
    "chunked_attention": "chunked local attention (each token sees its own chunk only)",
    "dummy": "layers that read another layer's KV cache (KV sharing)",
    "indexed_attention": "sparse attention whose keys an indexer picks (DeepSeek sparse attention)",
    # transformers 5.17 and earlier name it so
    "deepseek_sparse_attention": "sparse attention whose keys an indexer picks (DeepSeek sparse attention)",
}

#: model types that keep recurrent state although transformers reports only attention layers for them
RECURRENT_MODEL_TYPES = {
    "rwkv": "RWKV's recurrent state",
    "xlstm": "xLSTM's recurrent state",
    "lfm2": "LFM2's short-convolution state",
    "lfm2_moe": "LFM2's short-convolution state",
}


def text_config(config: Any) -> Any:
    """The decoder's config (the text config of multimodal wrappers)."""
    if hasattr(config, "get_text_config"):
        return config.get_text_config(decoder=True)
    return config


def resolved_layer_types(config: Any) -> list[str]:
    """Per decoder layer, its type as transformers' cache resolves it (``layer_types``, else a sliding
    window or an attention chunk in the config)."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        layer_types, _ = get_layer_types_and_kwargs(config)
        # transformers 5.17 and earlier drop the layers that share another's cache (Gemma 3n) from the
        # end of the list instead of naming them "dummy"
        shared = int(getattr(config, "num_kv_shared_layers", 0) or 0)
        dropped = len(layer_types) + shared == int(getattr(config, "num_hidden_layers", -1))
        return [str(t) for t in layer_types] + ["dummy"] * (shared if dropped else 0)
    except (ImportError, AttributeError, TypeError):  # an older transformers: read the config alone
        types = getattr(config, "layer_types", None)
        if types:
            return [str(t) for t in types]
        window = getattr(config, "sliding_window", None)
        return ["sliding_attention" if window else "full_attention"] * int(config.num_hidden_layers)


#: types of layers that mix no tokens (Nemotron-H's MLP and MoE layers): no cache, nothing to roll back
ATTENTION_FREE_LAYER_TYPES = ("moe", "mlp")


def attention_free_layers(config: Any) -> list[int]:
    """Indices of the decoder layers that mix no tokens (``ATTENTION_FREE_LAYER_TYPES`` in the config's
    own ``layer_types``; transformers' cache resolves them to ``dummy``, like layers that share a cache)."""
    raw = list(getattr(text_config(config), "layer_types", None) or [])
    return [i for i, kind in enumerate(raw) if kind in ATTENTION_FREE_LAYER_TYPES]


def is_latent_attention(config: Any) -> bool:
    """Whether the decoder uses multi-head latent attention (a compressed KV latent, ``kv_lora_rank``)."""
    return bool(getattr(text_config(config), "kv_lora_rank", None))


def _attention_modules(model: Any) -> list[Any]:
    """The decoder's self-attention modules (``layers[i].self_attn``), where the model has that shape."""
    return [layer.self_attn for layer in _decoder_layers(model) if hasattr(layer, "self_attn")]


def _passes_window(module: Any) -> bool:
    """Whether an attention module's ``forward`` hands a ``sliding_window=`` to the attention function
    (True where its source cannot be read: transformers' own classes always can)."""
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return True
    return "sliding_window=" in source


def _decoder_layers(model: Any) -> list[Any]:
    base = getattr(model, "model", model)
    base = getattr(base, "language_model", base)
    return list(getattr(base, "layers", None) or [])


def recurrent_mixers(model: Any) -> list[str]:
    """The mixer kinds (``runtime.mixers.MIXERS``) of ``model``'s ``linear_attention`` layers, when the
    engine runs every one of them with per-slot state; ``[]`` when it has none or one it does not run."""
    from spec_backend.runtime.mixers import mixer_kind

    types = resolved_layer_types(text_config(model.config))
    layers = _decoder_layers(model)
    linear = [layers[i] for i, t in enumerate(types) if t == "linear_attention" and i < len(layers)]
    if not linear or len(linear) != types.count("linear_attention"):
        return []
    kinds = [next((k for k in map(mixer_kind, layer.children()) if k), None) for layer in linear]
    return sorted({k for k in kinds if k}) if all(kinds) else []


def refusal(model: Any, recurrent: bool = True) -> str | None:
    """Why the engine cannot run ``model`` (``None``: it can); see the module docstring. ``recurrent``:
    whether linear-attention mixers may run (a target: yes; a draft model, whose cache rolls back several
    draft steps at once: no)."""
    config = text_config(model.config)
    model_type = str(getattr(config, "model_type", type(model).__name__))
    if model_type in RECURRENT_MODEL_TYPES:
        return (
            f"its decoder keeps {RECURRENT_MODEL_TYPES[model_type]}, which the engine's KV cache cannot hold"
        )
    free = set(attention_free_layers(config))
    types = [t for i, t in enumerate(resolved_layer_types(config)) if i not in free]
    mixers = recurrent_mixers(model)
    if mixers:
        if not recurrent:
            return (
                f"its {' and '.join(mixers)} (linear_attention) layers keep recurrent state, which the "
                "engine rolls back for a target model only: a draft model rolls back several draft steps at "
                "once"
            )
        types = [t for t in types if t != "linear_attention"]
    unknown = sorted({t for t in types if t not in ATTENTION_LAYER_TYPES})
    if unknown:
        missing = "; ".join(
            f"{t}: {MISSING_FOR_LAYER_TYPE.get(t, 'a layer kind it does not know')}" for t in unknown
        )
        return (
            f"it has decoder layers of type(s) {unknown} and the engine runs "
            f"{list(ATTENTION_LAYER_TYPES)} only (missing: {missing})"
        )
    if getattr(config, "index_topk", None):
        return (
            "its sparse attention picks keys with an indexer (DeepSeek sparse attention); the engine has none"
        )
    if getattr(config, "use_bidirectional_attention", False):
        return "its attention is bidirectional (use_bidirectional_attention=True), the engine's is causal"
    modules = _attention_modules(model)
    if "sliding_attention" in types and not all(_passes_window(m) for m in modules):
        return "its attention layers do not pass their sliding window to the attention function"
    if is_latent_attention(config) and not all(hasattr(m, "expand_kv") for m in modules):
        return (
            "its latent attention caches expanded keys (this transformers release), the engine caches latents"
        )
    return None


def check_architecture(model: Any, shown: str, recurrent: bool = True) -> None:
    """``ModelLoadError`` naming ``model``'s architecture and what the engine lacks, when it cannot run it
    (``recurrent``: see ``refusal``)."""
    reason = refusal(model, recurrent)
    if reason is not None:
        config = text_config(model.config)
        arch = getattr(config, "model_type", None) or type(model).__name__
        raise ModelLoadError(
            f"model {shown} ({arch}, {type(model).__name__}) cannot run in spec-backend: {reason}"
        )


__all__ = [
    "ATTENTION_FREE_LAYER_TYPES",
    "ATTENTION_LAYER_TYPES",
    "attention_free_layers",
    "check_architecture",
    "is_latent_attention",
    "recurrent_mixers",
    "refusal",
    "resolved_layer_types",
    "text_config",
]
