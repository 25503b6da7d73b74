"""The shape of a model's caches: which layers keep keys and values (full length or a window ring) and
which keep recurrent state, what one slot costs, and how many slots a memory budget holds."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from spec_backend.runtime.architectures import attention_free_layers
from spec_backend.runtime.recurrent_state import RecurrentSpec

logger = logging.getLogger("spec_backend.engine")


@dataclass(frozen=True)
class KVLayout:
    """Shape of one model's KV cache: decoder layers, kv heads, head dim, dtype, device, and the values'
    head dim where it differs from the keys' (``value_dim``; latent attention caches a compressed latent
    as "keys" and its rotary part as "values")."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    value_dim: int | None = None
    #: (layer index, state shape) of each linear-attention layer: per-slot recurrent state, no KV
    states: tuple[tuple[int, RecurrentSpec], ...] = ()
    #: (layer index, window) of each sliding-window layer whose keys live in a ring bounded by its window
    #: (``runtime.window_cache``); the other attention layers keep every position
    windows: tuple[tuple[int, int], ...] = ()
    #: layers that mix no tokens (``architectures.attention_free_layers``): nothing cached
    attention_free: tuple[int, ...] = ()

    @property
    def value_head_dim(self) -> int:
        """The values' head dim (the keys' unless ``value_dim`` says otherwise)."""
        return self.value_dim if self.value_dim is not None else self.head_dim

    @property
    def bytes_per_layer_position(self) -> int:
        """Bytes one cached position costs in one attention layer (keys and values)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.num_kv_heads * (self.head_dim + self.value_head_dim) * elem

    @property
    def bytes_per_position(self) -> int:
        """Bytes one cached position costs over the layers that keep every position."""
        full_layers = self.num_layers - len(self.states) - len(self.windows) - len(self.attention_free)
        return full_layers * self.bytes_per_layer_position

    @staticmethod
    def ring_reach(headroom: int) -> int:
        """How far back a window ring must reach, and how many positions of one step a recurrent state
        records, for a cache with ``headroom`` positions past its length (K): a rollback takes back at
        most the K drafts and the bonus position."""
        return headroom + 2

    def bytes_per_slot(self, max_len: int, headroom: int) -> int:
        """Bytes one slot costs: ``max_len + headroom`` positions of the full layers, each window layer's
        ring (``window + reach`` positions with its discard column) and the recurrent states."""
        reach = self.ring_reach(headroom)
        rings = sum(window + reach for _, window in self.windows) * self.bytes_per_layer_position
        states = sum(spec.bytes_per_slot(self.dtype, reach) for _, spec in self.states)
        return self.bytes_per_position * (max_len + headroom) + rings + states


def kv_layout(
    config: Any,
    dtype: torch.dtype,
    device: torch.device,
    attention_only: bool = False,
    bound_windows: bool = False,
) -> KVLayout:
    """The KV layout of a transformers config (its text config for multimodal wrappers). Its
    ``linear_attention`` layers get per-slot recurrent state instead of keys and values, unless
    ``attention_only`` (a drafter head's cache: its blocks are attention layers of the target's class,
    whose config still lists the target's layer types). With ``bound_windows`` its sliding-window layers
    keep a ring bounded by their window (``runtime.window_cache``) instead of every position.

    Multi-head latent attention (``kv_lora_rank``): transformers caches, per position, one latent of
    ``kv_lora_rank`` and one rotary key of ``qk_rope_head_dim`` shared by every head (``update`` receives
    them as keys and values of one head) and expands them into per-head keys and values itself.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(text.num_hidden_layers)
    if getattr(text, "kv_lora_rank", None):
        return KVLayout(
            layers, 1, int(text.kv_lora_rank), dtype, device, value_dim=int(text.qk_rope_head_dim)
        )
    heads = int(text.num_attention_heads)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or int(text.hidden_size) // heads
    types = [] if attention_only else list(getattr(text, "layer_types", None) or [])[:layers]
    states = tuple(
        (i, RecurrentSpec.from_config(text)) for i, kind in enumerate(types) if kind == "linear_attention"
    )
    windows = (
        tuple((i, w) for i, w in enumerate(layer_windows(text)) if w is not None) if bound_windows else ()
    )
    free = () if attention_only else tuple(attention_free_layers(text))
    return KVLayout(
        layers,
        int(kv_heads),
        int(head_dim),
        dtype,
        device,
        states=states,
        windows=windows,
        attention_free=free,
    )


def layer_windows(config: Any) -> list[int | None]:
    """Per decoder layer, its sliding window as transformers' cache resolves it (``None``: full)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, kwargs = get_layer_types_and_kwargs(config)
    if isinstance(kwargs, dict):  # transformers 5.17 and earlier: one dict for every layer
        kwargs = [kwargs] * len(types)
    return [
        int(kw["sliding_window"]) if t == "sliding_attention" and kw.get("sliding_window") else None
        for t, kw in zip(types, kwargs, strict=True)
    ]


def plan_num_slots(bytes_per_slot: int, max_len: int, max_num_seqs: int, memory_bytes: int | None) -> int:
    """Slots to preallocate: ``max_num_seqs``, or fewer when ``memory_bytes`` (every cache together, one
    slot costing ``bytes_per_slot``) cannot hold that many full-length requests. A budget below one
    full-length request is an error naming the numbers."""
    per_slot = bytes_per_slot
    if memory_bytes is None:
        return max_num_seqs
    fits = memory_bytes // per_slot
    if fits < 1:
        raise ValueError(
            f"kv_cache_memory_bytes={memory_bytes} cannot hold one request of max_model_len={max_len}: "
            f"one full-length request needs {per_slot} bytes of KV cache (target and draft caches); "
            f"raise kv_cache_memory_bytes to >= {per_slot} or lower max_model_len"
        )
    if fits < max_num_seqs:
        logger.warning(
            "KV cache budget of %d bytes holds %d full-length requests: max_num_seqs lowered from %d to %d",
            memory_bytes,
            fits,
            max_num_seqs,
            fits,
        )
    return int(min(fits, max_num_seqs))


__all__ = ["KVLayout", "kv_layout", "plan_num_slots"]
