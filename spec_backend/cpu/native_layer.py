"""Llama-shaped decoder layers of GGUF block-quantized models, each run as one native call
(``csrc/decoder_layer.cpp``).

Why: at batch 1 a SmolLM2 decode step on the reference machine spent about 11 of its 18 ms in Python —
transformers' module calls and some twenty small torch ops per layer — against about 7 ms in the
products. A ``NativeDecoderLayer`` replaces a whole ``LlamaDecoderLayer`` (or ``MistralDecoderLayer``)
whose seven projections run on our native kernels — Q4_1 (and Q4_K, Q4_0) layers on the Q4_1 kernel
(``int4_linear``) or GGUF blocks on the k8 kernel (``kquant_linear``), one kind per product — so a layer
costs one Python call. The ops are those of the ISA variant selected when the layer is built (``isa``).

Glossary:

* **fused weights** — the q, k and v projections' tiles (or codes) concatenated along their outputs (one
  product instead of three); gate and up likewise. A product whose layers mix the two kernels (a llama.cpp
  Q4_K_M layer with a Q6_K ``v_proj``) is not fused: the layer stays transformers'. The weight list the op
  takes is ``weight_names()``'s order.
* **ragged path** — inside an engine step (the cache has a ``StepBatch`` plan and the forward carries
  ``spec_attn_metadata``): norm, products, rotary embedding, the KV cache write and the row attention
  kernel (what ``sdpa_ragged_attention`` runs for these models) are one call.
* **general path** — any other caller (transformers' ``generate`` with its own cache, a forward without a
  cache, a captured layout): one native op computes q/k/v, the cache's ``update`` and the model's
  configured attention function run as in transformers, a second op does the rest. With the row
  attention kernel configured it gives the ragged path's result bit for bit.

Numerics: the products are the replaced layers' own (lossy against float32, as ``int4_linear`` says);
RMS norm, rotary embedding and SiLU run in float32 in a fixed order per row, so they differ from
transformers' modules in the last bits only (``tests/unit/test_native_layer.py`` bounds it), and a row's
result never depends on the other rows of the call: greedy speculative output equals plain greedy output.
``SPEC_BACKEND_NATIVE_LAYERS=0`` keeps transformers' layers (still on the packed products).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from spec_backend.cpu.int4_linear import Int4Linear
from spec_backend.cpu.kquant_linear import K8Linear
from spec_backend.cpu.native import active_variant, native_op, required_op
from spec_backend.cpu.vocab_projection import replace_modules
from spec_backend.step import RaggedAttentionMetadata, StepBatch

NATIVE_LAYERS_ENV = "SPEC_BACKEND_NATIVE_LAYERS"
#: decoder layer classes whose forward is exactly: norm, attention with rotary embedding, residual, norm,
#: SiLU-gated MLP, residual (with their norms' and attention's class names): the one list of what runs
SUPPORTED_LAYERS = {
    "LlamaDecoderLayer": ("LlamaRMSNorm", "LlamaAttention"),
    "MistralDecoderLayer": ("MistralRMSNorm", "MistralAttention"),
}
#: the op's products, each of (parent, projection) pairs: q|k|v, o, gate|up, down
_PRODUCTS = (
    (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj")),
    (("self_attn", "o_proj"),),
    (("mlp", "gate_proj"), ("mlp", "up_proj")),
    (("mlp", "down_proj"),),
)


class AttentionInfo(nn.Module):
    """What transformers' attention functions read from an attention module (no weights)."""

    def __init__(self, attn: Any, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.config = attn.config
        self.layer_idx = int(attn.layer_idx)
        self.head_dim = int(attn.head_dim)
        self.num_key_value_groups = heads // kv_heads
        self.scaling = float(attn.scaling)
        self.attention_dropout = 0.0
        self.is_causal = True


def _fuse(linears: list[Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layers' native weights concatenated along their outputs: Q4_1 tiles, scales and minima, or
    GGUF blocks' codes, scales and offsets (one kind per group: ``supported``)."""
    if isinstance(linears[0], K8Linear):
        return (
            torch.cat([m.codes for m in linears]),  # [sum N, K] int8
            torch.cat([m.scale for m in linears]),  # [sum N, K/16] or [sum N, K/32]
            torch.cat([m.low for m in linears]),  # [sum N, K/16] or empty
        )
    return (
        torch.cat([m.tiles for m in linears]),  # [sum N/16, G, 256] uint8
        torch.cat([m.tile_scale for m in linears]),  # [sum N/16, G, 16]
        torch.cat([m.tile_low for m in linears]),
    )


def _native_product(linears: list[Any]) -> bool:
    """Whether the layers can be one product of the op: all on our Q4_1 kernel or all on the k8 kernel
    (``kquant_linear``), without bias."""
    if any(getattr(m, "bias", None) is not None for m in linears):
        return False
    if all(isinstance(m, K8Linear) for m in linears):  # and of one form: with offsets or without
        return len({m.low.numel() > 0 for m in linears}) == 1
    return all(isinstance(m, Int4Linear) and m.kernel == "native" for m in linears)


def weight_names() -> tuple[str, ...]:
    """The op's weight list, in its order (``csrc/decoder_layer.cpp``)."""
    packed = ("tiles", "scale", "low")
    return (
        "input_norm",
        *(f"qkv_{p}" for p in packed),
        *(f"o_{p}" for p in packed),
        "post_norm",
        *(f"gate_up_{p}" for p in packed),
        *(f"down_{p}" for p in packed),
    )


class NativeDecoderLayer(nn.Module):
    """One supported decoder layer as native calls (module glossary); takes and returns what the layer
    it replaces does."""

    #: the native ops it calls, resolved when it is built (``isa``: their ISA variant)
    OPS: tuple[str, ...] = ("decoder_layer", "decoder_layer_qkv", "decoder_layer_out")

    def __init__(self, layer: Any) -> None:
        nn.Module.__init__(self)  # not the replaced class's __init__ (``native_class``)
        self._ops = {name: required_op(name) for name in self.OPS}
        variant = active_variant()
        self.isa = variant.name if variant is not None else ""
        attn, mlp = layer.self_attn, layer.mlp
        head_dim = int(attn.head_dim)
        heads, kv_heads = int(attn.q_proj.out_features) // head_dim, int(attn.k_proj.out_features) // head_dim
        self.self_attn = AttentionInfo(attn, heads, kv_heads)
        #: the ops' shape arguments: heads, kv heads, head dim, the norms' epsilon
        self.shape = (heads, kv_heads, head_dim, float(layer.input_layernorm.variance_epsilon))
        fused = (
            [layer.input_layernorm.weight.detach().float().contiguous()],
            _fuse([attn.q_proj, attn.k_proj, attn.v_proj]),
            _fuse([attn.o_proj]),
            [layer.post_attention_layernorm.weight.detach().float().contiguous()],
            _fuse([mlp.gate_proj, mlp.up_proj]),
            _fuse([mlp.down_proj]),
        )
        for name, tensor in zip(weight_names(), [t for group in fused for t in group], strict=True):
            self.register_buffer(name, tensor)
        self._weights = self._collect()

    def _collect(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in weight_names()]

    def _apply(self, fn: Any, recurse: bool = True) -> NativeDecoderLayer:
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self._weights = self._collect()  # buffers were replaced
        return self

    def forward(
        self,
        hidden_states: torch.Tensor,  # [B, Q, H] float32
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,  # cos, sin [B or 1, Q, D]
        cache: Any = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:  # [B, Q, H]
        if position_embeddings is None:
            raise ValueError("NativeDecoderLayer needs position_embeddings=(cos, sin) from the model")
        cos, sin = position_embeddings
        cache = cache if cache is not None else past_key_values
        for unused in ("position_ids", "use_cache"):  # rotary comes as position_embeddings; a cache is used
            kwargs.pop(unused, None)
        meta = kwargs.get("spec_attn_metadata")
        ragged = self._ragged_cache(cache, meta)
        if ragged is not None and isinstance(meta, RaggedAttentionMetadata):
            out: torch.Tensor = self._ops["decoder_layer"](
                hidden_states, cos, sin, self._weights, *ragged, meta.query_lens, meta.kv_lens, *self.shape,
                self.self_attn.scaling,
            )  # fmt: skip
            return out
        return self._general(hidden_states, cos, sin, attention_mask, cache, kwargs)

    def _ragged_cache(self, cache: Any, meta: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This layer's keys and values ``[B, Hkv, C, D]`` of the step's slots when the ragged path applies
        (an engine step: a ``StepBatch`` plan and ragged metadata, shapes not captured, not a token tree —
        the op masks causally by column, a tree by ancestry), else ``None``: the general path."""
        plan = getattr(cache, "plan", None)
        if (
            not isinstance(plan, StepBatch)
            or not isinstance(meta, RaggedAttentionMetadata)
            or plan.static_shapes
            or meta.tree is not None
        ):
            return None
        keys, values = cache.layers[self.self_attn.layer_idx].kv()  # [S, Hkv, C, D]
        end = plan.start + plan.batch_size
        return keys[plan.start : end], values[plan.start : end]

    def _general(
        self,
        x: torch.Tensor,  # [B, Q, H]
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Any,
        kwargs: dict[str, Any],
    ) -> torch.Tensor:
        qkv, finish = self._ops["decoder_layer_qkv"], self._ops["decoder_layer_out"]
        query, key, value = qkv(x, cos, sin, self._weights, *self.shape)  # [B, H, Q, D]
        attn = self._attend(query, key, value, attention_mask, cache, kwargs)
        out: torch.Tensor = finish(x, attn, self._weights, *self.shape)
        return out

    def _attend(
        self,
        query: torch.Tensor,  # [B, Hq, Q, D]
        key: torch.Tensor,  # [B, Hkv, Q, D]
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Any,
        kwargs: dict[str, Any],
    ) -> torch.Tensor:  # [B, Q, Hq, D]
        """The general path's middle: the caller's cache ``update``, then the configured attention."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.llama.modeling_llama import eager_attention_forward

        info = self.self_attn
        if cache is not None:
            key, value = cache.update(key, value, info.layer_idx, kwargs=kwargs)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(
            str(info.config._attn_implementation), eager_attention_forward
        )
        attn: torch.Tensor = attention(
            self.self_attn, query, key, value, attention_mask, dropout=0.0, scaling=info.scaling,
            **kwargs,
        )[0]  # fmt: skip
        return attn


_NATIVE_CLASSES: dict[tuple[type[nn.Module], type[nn.Module]], type[nn.Module]] = {}


def native_class(
    layer_class: type[nn.Module], base: type[nn.Module] = NativeDecoderLayer
) -> Callable[[nn.Module], nn.Module]:
    """``base`` (``NativeDecoderLayer``, or ``replayed_layer.ReplayedDecoderLayer``) that is also a
    ``layer_class`` (one class per pair), built from the layer it replaces: what transformers finds by
    class (the recorders behind ``output_hidden_states``) finds the native layer as it found that one."""
    found = _NATIVE_CLASSES.get((base, layer_class))
    if found is None:
        found = _NATIVE_CLASSES[(base, layer_class)] = type(
            f"{base.__name__.removesuffix('DecoderLayer')}{layer_class.__name__}", (base, layer_class), {}
        )
    return found


def supported(layer: nn.Module, extra: tuple[str, ...] = ()) -> bool:
    """Whether ``layer`` is a supported class whose projections all run on the native kernel without bias,
    with no module beyond the expected ones and the extra norms named in ``extra`` (EAGLE-3's
    ``hidden_norm``), float32 norms of one epsilon, SiLU and a head dim in 16, 32, .. 256."""
    names = SUPPORTED_LAYERS.get(type(layer).__name__)
    if names is None:
        return False
    norm_class, attn_class = names
    children = dict(layer.named_children())
    if set(children) != {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm", *extra}:
        return False
    attn, mlp = children["self_attn"], children["mlp"]
    config = getattr(attn, "config", None)
    if type(attn).__name__ != attn_class or getattr(config, "sliding_window", None) is not None:
        return False
    if getattr(config, "hidden_act", None) not in ("silu", "swish") or set(dict(mlp.named_children())) != {
        "gate_proj", "up_proj", "down_proj", "act_fn",
    }:  # fmt: skip
        return False
    for group in _PRODUCTS:
        if not _native_product([getattr(children[parent], name, None) for parent, name in group]):
            return False
    norms = [children["input_layernorm"], children["post_attention_layernorm"], *(children[e] for e in extra)]
    return all(
        type(n).__name__ == norm_class
        and getattr(n, "weight", torch.empty(0)).dtype == torch.float32
        and getattr(n, "variance_epsilon", None) == getattr(norms[0], "variance_epsilon", None)
        for n in norms
    ) and int(getattr(attn, "head_dim", 1)) in range(16, 257, 16)


def install_native_layers(model: nn.Module) -> int:
    """Replace every supported decoder layer of ``model`` (``supported``) by a ``NativeDecoderLayer``
    where the native op exists and ``SPEC_BACKEND_NATIVE_LAYERS`` is not ``0``; returns how many."""
    if os.environ.get(NATIVE_LAYERS_ENV, "1") == "0" or native_op("decoder_layer") is None:
        return 0
    layers = [(name, native_class(type(m))(m)) for name, m in model.named_modules() if supported(m)]
    return replace_modules(model, layers)


__all__ = [
    "NATIVE_LAYERS_ENV",
    "SUPPORTED_LAYERS",
    "AttentionInfo",
    "NativeDecoderLayer",
    "install_native_layers",
    "native_class",
    "supported",
    "weight_names",
]
