"""Float32 Llama-shaped decoder layers whose engine steps are replayed from C++ (``csrc/replayed_layer.cpp``).

Why: on a small model the forward's cost is the interpreter, not the arithmetic. With a tiny Llama (2 layers,
hidden 128) on the 2-core reference VM a decode step spent 2.4 of its 4.6 ms in the two decoder layers:
module calls, transformers' decorators and some forty torch ops per layer dispatched one by one from
Python, each a few microseconds of work. A ``ReplayedDecoderLayer`` makes one call per layer instead; the
C++ side makes the same ATen calls, with the same arguments and in the same order, as the Python it
replaces, so the step's logits and cache contents are the transformers layer's **bit for bit** (tested on
the model shapes it accepts, under the oldest and the newest transformers release the project supports).
It is the CPU's counterpart of a captured graph: the same kernels, without the host work between them.

Glossary:

* **replayed calls** — a ``LlamaDecoderLayer`` (or ``MistralDecoderLayer``) forward during an engine step:
  ``LlamaRMSNorm``, the seven projections as the modules there run them (``TallSkinnyProjection``'s
  few-row product at its measured row counts, else ``F.linear``), ``apply_rotary_pos_emb``,
  ``RaggedKVLayer.update`` and ``sdpa_ragged_attention`` (the reference's and, for models not marked
  batch-invariant, the cpu backend's attention), the residual adds and the SiLU-gated MLP.
* **engine step** — what the op takes: a ``StepBatch`` plan on the cache (shapes not captured, not a token
  tree), the layer's cache a full-attention ``RaggedKVLayer`` and its keys seen from position 0 (no
  window), the configured attention one of the two above, and no forward hook on a module whose call the
  op makes in its place (the layer's own hooks, the hidden-state capture's, fire as usual). Any other
  call (transformers' ``generate``, a batch-invariant model) runs the layer's own forward.

The layer keeps the replaced module's children, parameters and hooks (state-dict keys are unchanged), and
is an instance of the replaced class (``native_class``), so what transformers finds by class finds it.
``SPEC_BACKEND_NATIVE_LAYERS=0`` keeps transformers' layers.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from spec_backend.backends.attention import ragged_causal_mask, sdpa_ragged_attention
from spec_backend.cpu.attention import cpu_ragged_attention, is_batch_invariant
from spec_backend.cpu.native import native_op, required_op
from spec_backend.cpu.native_layer import NATIVE_LAYERS_ENV, SUPPORTED_LAYERS, native_class
from spec_backend.cpu.vocab_projection import TallSkinnyProjection, replace_modules
from spec_backend.runtime.hf_compat import cache_name
from spec_backend.runtime.lean_forward import hooked
from spec_backend.step import RaggedAttentionMetadata, StepBatch

#: the op's weights in its order (``csrc/replayed_layer.cpp``): (child, parameter) paths
WEIGHTS = (
    ("input_layernorm",),
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("post_attention_layernorm",),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
    ("mlp", "down_proj"),
)
#: attention functions whose engine-step result the op reproduces (``cpu_ragged_attention`` only for
#: models not marked batch-invariant: it then calls ``sdpa_ragged_attention``)
_REPLAYED_ATTENTION = (sdpa_ragged_attention, cpu_ragged_attention)
#: keyword arguments that would make the attention function do more than causal SDPA
_ATTENTION_EXTRAS = ("sliding_window", "s_aux", "softcap")


def _module(layer: nn.Module, path: tuple[str, ...]) -> Any:
    found: Any = layer
    for name in path:
        found = getattr(found, name, None)
    return found


def product_rows(linear: Any) -> int | None:
    """How the op runs a projection: a bit mask of the row counts that take the tall-skinny product
    (``TallSkinnyProjection.rows``; ``0``: a plain float32 ``nn.Linear``, ``F.linear`` at every count);
    ``None`` when it cannot (a bias, another module or dtype, a row count past 62)."""
    if getattr(linear, "bias", None) is not None or getattr(linear, "weight", None) is None:
        return None
    if linear.weight.dtype != torch.float32 or linear.weight.dim() != 2:
        return None
    if type(linear) is nn.Linear:
        return 0
    if type(linear) is not TallSkinnyProjection or any(not 0 < m < 63 for m in linear.rows):
        return None
    return sum(1 << m for m in linear.rows)


def supported(layer: nn.Module) -> bool:
    """Whether ``layer`` is a registry class (``native_layer.SUPPORTED_LAYERS``) with exactly its expected
    children, float32 weights without bias, all seven projections run one way, SiLU and no window."""
    names = SUPPORTED_LAYERS.get(type(layer).__name__)
    if names is None:
        return False
    children = dict(layer.named_children())
    if set(children) != {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}:
        return False
    attn, mlp = children["self_attn"], children["mlp"]
    config = getattr(attn, "config", None)
    if type(attn).__name__ != names[1] or getattr(config, "sliding_window", None) is not None:
        return False
    if set(dict(attn.named_children())) != {"q_proj", "k_proj", "v_proj", "o_proj"}:
        return False
    if set(dict(mlp.named_children())) != {"gate_proj", "up_proj", "down_proj", "act_fn"}:
        return False
    if type(mlp.act_fn).__name__ not in ("SiLUActivation", "SiLU"):
        return False
    norms = (children["input_layernorm"], children["post_attention_layernorm"])
    if any(type(n).__name__ != names[0] or n.weight.dtype != torch.float32 for n in norms):
        return False
    if norms[0].variance_epsilon != norms[1].variance_epsilon:
        return False
    rows = {product_rows(_module(layer, path)) for path in WEIGHTS if len(path) == 2}
    return len(rows) == 1 and None not in rows


class ReplayedDecoderLayer(nn.Module):
    """A supported layer (``supported``) whose engine steps run as one native call (module glossary)."""

    self_attn: Any  # the replaced layer's children (module glossary)
    input_layernorm: Any

    def __init__(self, layer: Any) -> None:
        nn.Module.__init__(self)
        self.__dict__.update(layer.__dict__)  # the same children, parameters, buffers and hooks
        self._replay = required_op("replayed_decoder_layer")
        # here, not at the top: the cache imports transformers, which a core-only install lacks (a layer
        # exists only where a model was loaded)
        from spec_backend.runtime.kv_cache import RaggedKVLayer

        self._full_attention_layer = RaggedKVLayer
        attn = layer.self_attn
        head_dim = int(attn.head_dim)
        heads, kv_heads = (
            int(attn.q_proj.weight.shape[0]) // head_dim,
            int(attn.k_proj.weight.shape[0]) // head_dim,
        )
        rows = product_rows(attn.q_proj)
        assert rows is not None
        #: the op's shape arguments: heads, kv heads, head dim, the norms' epsilon, scale, tall-skinny rows
        eps = float(layer.input_layernorm.variance_epsilon)
        self._shape = (heads, kv_heads, head_dim, eps, float(attn.scaling), rows)
        self._weights = self._collect()
        #: the modules whose calls the op makes in their place: a hook on one runs the layer's forward
        self._inner = [m for m in self.modules() if m is not self]
        self._cache_name = cache_name(type(layer))

    def _collect(self) -> list[torch.Tensor]:
        return [_module(self, path).weight for path in WEIGHTS]

    def _apply(self, fn: Any, recurse: bool = True) -> ReplayedDecoderLayer:
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self._weights = self._collect()  # parameters may have been replaced
        return self

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        step = self._step(hidden_states, args, kwargs)
        if step is None:  # the cache under the name the replaced class declares (``hf_compat``)
            cache = kwargs.pop("cache", None) if "cache" in kwargs else kwargs.pop("past_key_values", None)
            return super().forward(hidden_states, *args, **{self._cache_name: cache}, **kwargs)
        cache, plan, meta = step
        cos, sin = kwargs["position_embeddings"]
        keys, values = cache.layers[self.self_attn.layer_idx].kv()  # [S, Hkv, C, D]
        mask = ragged_causal_mask(meta, plan.max_query_len, plan.max_seq_len)  # [B, 1, Q, L]
        out: torch.Tensor = self._replay(
            hidden_states, cos, sin, self._weights, keys, values, plan.start, plan.max_seq_len, plan.rows,
            plan.cols, plan.positions, mask, *self._shape,
        )  # fmt: skip
        return out

    def _step(
        self, x: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, StepBatch, RaggedAttentionMetadata] | None:
        """The cache, plan and metadata of an engine step the op reproduces (module glossary), else
        ``None``."""
        if args or x.dtype != torch.float32 or x.dim() != 3 or kwargs.get("position_embeddings") is None:
            return None
        if any(kwargs.get(name) is not None for name in _ATTENTION_EXTRAS) or hooked(self._inner):
            return None
        cache: Any = kwargs.get("cache", kwargs.get("past_key_values"))
        plan, meta = getattr(cache, "plan", None), kwargs.get("spec_attn_metadata")
        if (
            not isinstance(plan, StepBatch)
            or plan.static_shapes
            or not isinstance(meta, RaggedAttentionMetadata)
        ):
            return None
        attn = self.self_attn
        if (
            meta.tree is not None
            or meta.for_layer(attn) is not meta
            or x.shape[:2] != (plan.batch_size, plan.max_query_len)
        ):
            return None
        if type(cache.layers[attn.layer_idx]) is not self._full_attention_layer:
            return None
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        attention = ALL_ATTENTION_FUNCTIONS.get(str(attn.config._attn_implementation))
        if attention not in _REPLAYED_ATTENTION or is_batch_invariant(attn):
            return None
        return cache, plan, meta


def install_replayed_layers(model: nn.Module) -> int:
    """Replace every supported layer of ``model`` (``supported``; after its projections took their final
    form) by a ``ReplayedDecoderLayer`` where the op exists and ``SPEC_BACKEND_NATIVE_LAYERS`` is not ``0``;
    returns how many."""
    if os.environ.get(NATIVE_LAYERS_ENV, "1") == "0" or native_op("replayed_decoder_layer") is None:
        return 0
    layers = [
        (name, native_class(type(m), ReplayedDecoderLayer)(m))
        for name, m in model.named_modules()
        if supported(m)
    ]
    return replace_modules(model, layers)


__all__ = ["WEIGHTS", "ReplayedDecoderLayer", "install_replayed_layers", "product_rows", "supported"]
