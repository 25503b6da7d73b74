"""The engine's ragged KV cache: a ``transformers`` ``Cache`` with per-request lengths and rollback.

Layout: every layer owns two tensors ``[slots, num_kv_heads, capacity, head_dim]``. A request lives in
one *slot* (a row of the batch dimension) for its whole life; the engine keeps the live slots packed
at ``0 .. n-1`` (``move_slot`` fills a freed slot with the last one), so one step's batch is always a
contiguous slot range and the keys handed to attention are views, never gathers.

One step: ``begin_step(start, query_lens)`` reserves ``query_lens[b]`` positions after slot
``start+b``'s current length, returns the ``RaggedAttentionMetadata`` and the ``position_ids`` for the
forward, and commits the new lengths (kv lengths include this step's tokens). Each layer's ``update``
scatters the new keys/values of the valid (non-padding) query rows into place and returns the views
``[B, H, max_kv_len, D]``. Rollback of rejected drafts is ``truncate(slot, length)``: an O(1) length
change — stale entries beyond a length are masked by attention and overwritten later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from spec_backend.backends.attention import RaggedAttentionMetadata

#: Capacity along the sequence dimension grows in multiples of this many positions.
_LEN_GRANULE = 256


@dataclass(frozen=True)
class StepPlan:
    """Where one forward's new keys go: flattened over the valid query rows of the batch."""

    start: int  # first slot of the batch (the batch covers slots start .. start+B-1)
    batch: int  # B
    max_kv_len: int  # longest kv length in the batch after this step
    rows: torch.Tensor  # [N] int64, batch row (0..B-1) of each valid query token
    cols: torch.Tensor  # [N] int64, query index (0..Q-1) of each valid query token
    positions: torch.Tensor  # [N] int64, absolute cache position of each valid query token
    metadata: RaggedAttentionMetadata


class RaggedKVLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """One decoder layer's keys and values for every slot; grows its capacity on demand."""

    is_croppable = True
    is_sliding = False

    def __init__(self, owner: RaggedKVCache) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate at the owner's current capacity with the model's head count, head dim and dtype."""
        b_cap, l_cap = self.owner.slot_capacity, self.owner.len_capacity
        k_shape = (b_cap, key_states.shape[1], l_cap, key_states.shape[3])
        v_shape = (b_cap, value_states.shape[1], l_cap, value_states.shape[3])
        self.keys = torch.zeros(k_shape, dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros(v_shape, dtype=value_states.dtype, device=value_states.device)
        self.is_initialized = True

    def _grow(self) -> None:
        assert self.keys is not None and self.values is not None
        b_cap, l_cap = self.owner.slot_capacity, self.owner.len_capacity
        if self.keys.shape[0] >= b_cap and self.keys.shape[2] >= l_cap:
            return
        old_b, old_l = self.keys.shape[0], self.keys.shape[2]
        new_b, new_l = max(b_cap, old_b), max(l_cap, old_l)
        for name in ("keys", "values"):
            old: torch.Tensor = getattr(self, name)
            new = old.new_zeros((new_b, old.shape[1], new_l, old.shape[3]))
            new[:old_b, :, :old_l] = old
            setattr(self, name, new)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys/values ``[B, H, Q, D]`` and return the batch's views ``[B, H, L, D]``."""
        plan = self.owner.plan
        if plan is None:
            raise RuntimeError("RaggedKVCache.update called outside a step: call begin_step() first")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._grow()
        assert self.keys is not None and self.values is not None
        if plan.batch == 1:  # one request: a plain slice copy
            first, n = plan.max_kv_len - plan.rows.numel(), plan.rows.numel()
            self.keys[plan.start, :, first : first + n] = key_states[0, :, :n]
            self.values[plan.start, :, first : first + n] = value_states[0, :, :n]
        else:
            slots = plan.rows + plan.start  # [N]
            self.keys[slots, :, plan.positions] = key_states[plan.rows, :, plan.cols].to(self.keys.dtype)
            self.values[slots, :, plan.positions] = value_states[plan.rows, :, plan.cols].to(
                self.values.dtype
            )
        end = plan.start + plan.batch
        return self.keys[plan.start : end, :, : plan.max_kv_len], self.values[
            plan.start : end, :, : plan.max_kv_len
        ]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        plan = self.owner.plan
        return (plan.max_kv_len if plan is not None else query_length), 0

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    def get_max_length(self) -> int:
        return self.owner.max_len

    def crop(self, tokens_to_remove: int) -> None:
        self.owner.crop(tokens_to_remove)


class RaggedKVCache(Cache):
    """Per-request KV cache for batched speculative verification (see module docstring).

    ``max_len``: most positions one request may hold (the engine's ``max_model_len``).
    ``num_layers``: the model's decoder layers (one ``RaggedKVLayer`` each).
    """

    def __init__(self, num_layers: int, max_len: int, initial_slots: int = 1) -> None:
        self.max_len = max_len
        self.slot_capacity = max(1, initial_slots)
        self.len_capacity = min(max_len, _LEN_GRANULE)
        self.lengths: list[int] = []  # per live slot, valid cached positions
        self.plan: StepPlan | None = None
        super().__init__(layers=[RaggedKVLayer(self) for _ in range(num_layers)])

    # -- slots ---------------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        """Live slots (requests holding cache)."""
        return len(self.lengths)

    def add_slot(self) -> int:
        """Open a new empty slot at the end and return its index."""
        self.lengths.append(0)
        if len(self.lengths) > self.slot_capacity:
            self.slot_capacity = max(len(self.lengths), 2 * self.slot_capacity)
        return len(self.lengths) - 1

    @torch.inference_mode()
    def move_slot(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s cached positions into slot ``dst`` (used to keep live slots packed)."""
        n = self.lengths[src]
        for layer in self.layers:
            if isinstance(layer, RaggedKVLayer) and layer.keys is not None and layer.values is not None:
                layer.keys[dst, :, :n] = layer.keys[src, :, :n]
                layer.values[dst, :, :n] = layer.values[src, :, :n]
        self.lengths[dst] = n

    def pop_slot(self) -> None:
        """Drop the last slot (the engine moved it elsewhere or it finished)."""
        self.lengths.pop()

    def truncate(self, slot: int, length: int) -> None:
        """Roll slot ``slot`` back to ``length`` cached positions (rejected drafts are forgotten)."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length

    # -- one forward ---------------------------------------------------------------------------------
    def begin_step(
        self, start: int, query_lens: list[int], device: torch.device
    ) -> tuple[RaggedAttentionMetadata, torch.Tensor]:
        """Reserve positions for one forward over slots ``start .. start+len(query_lens)-1``.

        Returns the attention metadata and ``position_ids [B, Q]`` (padding rows repeat valid positions).
        The new lengths are committed immediately; roll back with ``truncate``.
        """
        batch, q_max = len(query_lens), max(query_lens)
        old = self.lengths[start : start + batch]
        new = [o + q for o, q in zip(old, query_lens, strict=True)]
        max_kv = max(new)
        if max_kv > self.max_len:
            raise ValueError(
                f"KV cache overflow: a request needs {max_kv} positions, max_model_len is {self.max_len}"
            )
        if max_kv > self.len_capacity:
            granules = -(-max(max_kv, 2 * self.len_capacity) // _LEN_GRANULE)
            self.len_capacity = min(self.max_len, granules * _LEN_GRANULE)
        q_lens = torch.tensor(query_lens, dtype=torch.long, device=device)  # [B]
        kv_lens = torch.tensor(new, dtype=torch.long, device=device)  # [B]
        q_idx = torch.arange(q_max, device=device)  # [Q]
        base = kv_lens - q_lens  # [B] first new position per request
        position_ids = base[:, None] + torch.minimum(q_idx[None, :], (q_lens - 1)[:, None])  # [B, Q]
        valid = q_idx[None, :] < q_lens[:, None]  # [B, Q]
        rows, cols = valid.nonzero(as_tuple=True)  # [N], [N]
        self.plan = StepPlan(
            start=start,
            batch=batch,
            max_kv_len=max_kv,
            rows=rows,
            cols=cols,
            positions=base[rows] + cols,
            metadata=RaggedAttentionMetadata(query_lens=q_lens, kv_lens=kv_lens),
        )
        self.lengths[start : start + batch] = new
        return self.plan.metadata, position_ids

    def end_step(self) -> None:
        """Forget the step plan (guards against stray updates outside a step)."""
        self.plan = None

    # -- transformers Cache API ----------------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Longest cached length over the live slots (transformers only uses it for defaults)."""
        return max(self.lengths, default=0)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return (self.plan.max_kv_len if self.plan is not None else query_length), 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.max_len

    def crop(self, tokens_to_remove: int) -> None:
        """Remove ``-tokens_to_remove`` positions from every live slot (transformers' convention)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of positions to remove")
        self.lengths = [max(0, n + tokens_to_remove) for n in self.lengths]

    def reset(self) -> None:
        """Forget every slot (allocations are kept for reuse)."""
        self.lengths = []
        self.plan = None
