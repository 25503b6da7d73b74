"""The engine's ragged KV cache: a ``transformers`` ``Cache`` with per-request lengths and rollback.

Layout: every layer owns two tensors ``[slots, num_kv_heads, capacity, head_dim]``, **allocated once at
start-up** (``capacity = max_len + headroom``), so their addresses never change and captured graphs
stay valid. A request lives in one *slot* for its whole life; the engine keeps the live slots packed at
``0 .. n-1`` (``move_slot`` fills a freed slot with the last one), so one step's batch is a contiguous
slot range and the keys handed to attention are views, never gathers.

One step: ``begin_step(batch)`` takes the step's ``StepBatch`` (its positions, rows/cols and seq lens
are the plan), commits the new lengths, and each layer's ``update`` scatters the new keys/values of the
valid query rows into place and returns the views ``[B, H, max_seq_len, D]``. Rollback of rejected
drafts is ``truncate(slot, length)``: an O(1) length change — stale entries beyond a length are masked
by attention and overwritten later. Memory is reserved with ``torch.empty`` and zeroed lazily up to each
slot's high-water mark, so masked-out positions attention reads are always finite.

*headroom*: positions past ``max_len`` a drafter may write while drafting beyond the last position it
can emit (a draft cache); the target's cache has none.

Sliding-window layers keep a ring bounded by their window (``runtime.window_cache``) when the layout says
so (``KVLayout.windows``; the engine bounds them while prefix caching is off, since cached prefixes need
every position); otherwise every position, like full-attention layers, and the attention's mask applies
the window. Linear-attention layers keep per-slot recurrent state instead (``runtime.recurrent_state``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache

from spec_backend.runtime.kv_layout import KVLayout, kv_layout, plan_num_slots
from spec_backend.runtime.recurrent_state import RecurrentState
from spec_backend.runtime.window_cache import OwnedCacheLayer, WindowKVLayer
from spec_backend.step import StepBatch

logger = logging.getLogger("spec_backend.engine")

#: positions zeroed ahead of the longest sequence (one zeroing pass per this many decode steps)
_ZERO_GRANULE = 256


class RaggedKVLayer(OwnedCacheLayer):  # type: ignore[no-untyped-call]
    """One decoder layer's keys and values for every slot (allocated by the owner)."""

    is_sliding = False

    def __init__(self, owner: RaggedKVCache, layout: KVLayout, shape: tuple[int, int, int, int]) -> None:
        super().__init__(owner)
        self.keys = torch.empty(shape, dtype=layout.dtype, device=layout.device)  # [S, H, C, D]
        value_shape = (*shape[:3], layout.value_head_dim)
        self.values = torch.empty(value_shape, dtype=layout.dtype, device=layout.device)  # [S, H, C, Dv]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the tensors are allocated at start-up."""

    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The preallocated keys and values ``[S, H, C, D]``."""
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys/values ``[B, H, Q, D]`` / ``[B, H, Q, Dv]``; return the batch's views
        ``[B, H, L, D]`` / ``[B, H, L, Dv]``."""
        batch = self.owner.plan
        if batch is None:
            raise RuntimeError("RaggedKVCache.update called outside a step: call begin_step() first")
        assert self.keys is not None and self.values is not None
        if (
            key_states.shape[1] != self.keys.shape[1]
            or key_states.shape[3] != self.keys.shape[3]
            or value_states.shape[3] != self.values.shape[3]
        ):
            raise ValueError(
                f"the model produced keys of shape {list(key_states.shape)} and values of shape "
                f"{list(value_states.shape)} but the cache was allocated for {self.keys.shape[1]} kv heads "
                f"of dims {self.keys.shape[3]} / {self.values.shape[3]} (from the model config)"
            )
        if batch.batch_size == 1 and not batch.static_shapes:  # one request: a plain slice copy
            n = batch.num_tokens
            first = batch.max_seq_len - n
            self.keys[batch.start, :, first : first + n] = key_states[0, :, :n]
            self.values[batch.start, :, first : first + n] = value_states[0, :, :n]
        else:
            slots = batch.rows + batch.start  # [N]
            self.keys[slots, :, batch.positions] = key_states[batch.rows, :, batch.cols].to(self.keys.dtype)
            self.values[slots, :, batch.positions] = value_states[batch.rows, :, batch.cols].to(
                self.values.dtype
            )
        end, length = batch.start + batch.batch_size, batch.max_seq_len
        return self.keys[batch.start : end, :, :length], self.values[batch.start : end, :, :length]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        plan = self.owner.plan
        return (plan.max_seq_len if plan is not None else query_length), 0


class NoCacheLayer:
    """The place of a layer that mixes no tokens (an MLP or MoE layer of Nemotron-H): nothing cached."""

    is_sliding = False
    is_compileable = True
    is_initialized = True
    supports_early_init = False
    is_croppable = True


class RaggedKVCache(Cache):
    """Per-request KV cache for batched speculative verification (see module docstring).

    ``layout``: the model's KV shape; ``max_len``: most positions one request may hold (the engine's
    ``max_model_len``); ``num_slots``: requests it holds at once; ``headroom``: see module docstring.
    """

    def __init__(self, layout: KVLayout, max_len: int, num_slots: int, headroom: int = 0) -> None:
        if num_slots < 1 or max_len < 1 or headroom < 0:
            raise ValueError(f"bad cache size: num_slots={num_slots}, max_len={max_len}, headroom={headroom}")
        self.layout = layout
        self.max_len = max_len
        self.capacity = max_len + headroom
        self.slot_capacity = num_slots
        self.lengths: list[int] = []  # per live slot, valid cached positions
        self._zeroed = [0] * num_slots  # per slot, positions known to hold finite values
        self.plan: StepBatch | None = None
        shape = (num_slots, layout.num_kv_heads, self.capacity, layout.head_dim)
        specs, windows = dict(layout.states), dict(layout.windows)
        reach = layout.ring_reach(headroom)
        layers: list[Any] = [
            NoCacheLayer()
            if i in layout.attention_free
            else RecurrentState(self, specs[i], num_slots, layout.dtype, layout.device, reach)
            if i in specs
            else WindowKVLayer(self, layout, num_slots, i, windows[i], reach)
            if i in windows
            else RaggedKVLayer(self, layout, shape)
            for i in range(layout.num_layers)
        ]
        super().__init__(layers=layers)
        self.recurrent_layers = [layer for layer in layers if isinstance(layer, RecurrentState)]
        self.window_layers = [layer for layer in layers if isinstance(layer, WindowKVLayer)]

    # -- slots ---------------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        """Live slots (requests holding cache)."""
        return len(self.lengths)

    def add_slot(self) -> int:
        """Open a new empty slot at the end and return its index."""
        if len(self.lengths) >= self.slot_capacity:
            raise RuntimeError(f"all {self.slot_capacity} KV cache slots are in use")
        self.lengths.append(0)
        for state in self.recurrent_layers:
            state.add_slot(len(self.lengths) - 1)
        return len(self.lengths) - 1

    @torch.inference_mode()
    def move_slot(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s cached positions into slot ``dst`` (used to keep live slots packed)."""
        n = self.lengths[src]
        for keys, values in self._kv():
            keys[dst, :, :n] = keys[src, :, :n]
            values[dst, :, :n] = values[src, :, :n]
        for state in self.recurrent_layers:
            state.move_slot(src, dst)
        for ring in self.window_layers:
            ring.move_slot(src, dst)
        self.lengths[dst] = n
        self._zeroed[dst] = max(self._zeroed[dst], n)

    def pop_slot(self) -> None:
        """Drop the last slot (the engine moved it elsewhere or it finished)."""
        self.lengths.pop()

    def truncate(self, slot: int, length: int) -> None:
        """Roll slot ``slot`` back to ``length`` cached positions (rejected drafts are forgotten)."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        for ring in self.window_layers:
            ring.check_rollback(slot, self.lengths[slot], length)
        for state in self.recurrent_layers:  # recurrent state: recomputed over the kept positions
            state.rollback(slot, self.lengths[slot], length)
        self.lengths[slot] = length

    @torch.inference_mode()
    def keep_path(self, slot: int, first: int, columns: Sequence[int]) -> None:
        """After a token-tree step written at ``first + column``: keep the accepted path only — the keys
        and values of ``columns`` (increasing, column 0 the step's first token) move to ``first ..`` and
        the slot ends after them."""
        n = len(columns)
        if n == 0 or columns[0] != 0 or any(b <= a for a, b in itertools.pairwise(columns)):
            raise ValueError(f"a tree path starts at column 0 and increases, got {list(columns)}")
        if first + columns[-1] >= self.lengths[slot]:
            raise ValueError(
                f"slot {slot} holds {self.lengths[slot]} positions, path {list(columns)} from {first}"
            )
        if self.layout.states or self.layout.windows:
            raise RuntimeError(
                "token trees need a cache that keeps every position (no recurrent state or rings)"
            )
        source = torch.tensor([first + c for c in columns], device=self.layout.device)  # [n]
        for keys, values in self._kv():
            keys[slot, :, first : first + n] = keys[slot, :, source]
            values[slot, :, first : first + n] = values[slot, :, source]
        self.lengths[slot] = first + n

    @torch.inference_mode()
    def read_positions(self, slot: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot ``slot``'s cached positions ``[start, end)`` of every layer, copied:
        keys ``[layers, H, end - start, D]`` and values ``[layers, H, end - start, Dv]``."""
        if not 0 <= start <= end <= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} positions, asked for [{start}, {end})")
        if self.layout.states or self.layout.windows:
            raise RuntimeError("a cache with recurrent state or window rings does not keep every position")
        kv = self._kv()
        return (
            torch.stack([keys[slot, :, start:end] for keys, _ in kv]),
            torch.stack([values[slot, :, start:end] for _, values in kv]),
        )

    @torch.inference_mode()
    def append_positions(self, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append positions to slot ``slot`` (a prefix cache hit): ``keys`` ``[layers, H, n, D]``,
        ``values`` ``[layers, H, n, Dv]`` land at the slot's end, which grows by ``n``."""
        if self.layout.states or self.layout.windows:
            raise RuntimeError("a cache with recurrent state or window rings cannot take stored positions")
        first, n = self.lengths[slot], int(keys.shape[2])
        if first + n > self.max_len or values.shape[2] != n or keys.shape[0] != self.layout.num_layers:
            raise ValueError(
                f"cannot append {n} positions of {keys.shape[0]} layers to slot {slot} holding {first} "
                f"(max_len {self.max_len}, {self.layout.num_layers} layers)"
            )
        for layer, (dst_k, dst_v) in enumerate(self._kv()):
            dst_k[slot, :, first : first + n] = keys[layer]
            dst_v[slot, :, first : first + n] = values[layer]
        self.lengths[slot] = first + n
        self._zeroed[slot] = max(self._zeroed[slot], first + n)

    @torch.inference_mode()
    def zero_all(self) -> None:
        """Zero every position of every slot (for captured graphs, which read whole slots)."""
        for keys, values in self._kv():
            keys.zero_()
            values.zero_()
        for state in self.recurrent_layers:
            state.zero_all()
        self._zeroed = [self.capacity] * self.slot_capacity

    def _kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.kv() for layer in self.layers if isinstance(layer, RaggedKVLayer)]

    # -- one forward ---------------------------------------------------------------------------------
    def begin_step(self, batch: StepBatch) -> None:
        """Commit ``batch``'s seq lens for its slots; ``update`` writes the keys where it says."""
        end = batch.start + batch.batch_size
        if batch.start < 0 or end > len(self.lengths):
            raise ValueError(
                f"step covers slots {batch.start}..{end - 1}, {len(self.lengths)} slot(s) are live"
            )
        if batch.max_seq_len > self.capacity:
            raise ValueError(
                f"KV cache overflow: a request needs {batch.max_seq_len} positions, "
                f"max_model_len is {self.max_len}"
            )
        upto = min(self.capacity, batch.max_seq_len + _ZERO_GRANULE)
        for slot in range(batch.start, end):  # masked positions attention reads must be finite
            if self._zeroed[slot] < batch.max_seq_len:  # zero ahead, a granule at a time
                for keys, values in self._kv():
                    keys[slot, :, self._zeroed[slot] : upto] = 0
                    values[slot, :, self._zeroed[slot] : upto] = 0
                self._zeroed[slot] = upto
        for state in self.recurrent_layers:
            state.begin(batch, self.lengths)
        self.lengths[batch.start : end] = [
            length + q
            for length, q in zip(self.lengths[batch.start : end], batch.query_lens_host, strict=True)
        ]
        self.plan = batch

    def end_step(self) -> None:
        """Forget the step plan (guards against stray updates outside a step)."""
        self.plan = None

    # -- transformers Cache API ----------------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Longest cached length over the live slots (transformers only uses it for defaults)."""
        return max(self.lengths, default=0)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return (self.plan.max_seq_len if self.plan is not None else query_length), 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.max_len

    def crop(self, tokens_to_remove: int) -> None:
        """Remove ``-tokens_to_remove`` positions from every live slot (transformers' convention)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of positions to remove")
        for slot, n in enumerate(self.lengths):
            self.truncate(slot, max(0, n + tokens_to_remove))

    def reset(self) -> None:
        """Forget every slot (allocations are kept for reuse)."""
        self.lengths = []
        self.plan = None
        for state in self.recurrent_layers:
            state.reset()


__all__ = ["KVLayout", "RaggedKVCache", "RaggedKVLayer", "kv_layout", "plan_num_slots"]
