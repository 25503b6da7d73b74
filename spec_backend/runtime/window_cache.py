"""Keys and values of sliding-window layers, bounded by the window: a ring per slot.

Glossary:

- *window* ``W``: a query at position ``p`` sees keys at ``p - W + 1 .. p``.
- *ring*: per slot, ``R = W - 1 + reach`` positions; position ``p`` lives at column ``p % R``. ``reach``
  is the most positions a rollback may take back plus one (the engine's ``K`` speculative tokens and the
  bonus position): rejected drafts written at ``p`` overwrite only ``p - R``, which is older than any
  position a later query sees. A column ``R`` past the ring takes the writes of positions a long prefill
  step would itself overwrite (older than ``R`` positions before its end), so no column is written twice
  in one step.
- *window view*: what ``update`` hands the attention: per batch row, the cached positions
  ``offset .. offset + M + Q - 1`` in order (``M = W - 1`` positions before the step, then the step's
  own), ``offset = max(0, start - M)`` where ``start`` is the row's first query position. The attention
  sees them as keys ``0 ..``: the layer's lengths (``RaggedAttentionMetadata.for_layer``) are the row's
  kv length minus its offset, so every relative distance, and with it the causal and window masks, is
  the one the full cache would give.

Memory per slot and layer: ``R`` positions instead of ``max_model_len``. Positions older than the window
are gone, so ``read_positions`` (the prefix cache) cannot serve these layers: the engine bounds windows
only while prefix caching is off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import CacheLayerMixin

from spec_backend.step import RaggedAttentionMetadata

if TYPE_CHECKING:
    from spec_backend.runtime.kv_layout import KVLayout
    from spec_backend.step import StepPlanned


class OwnedCacheLayer(CacheLayerMixin):
    """A cache layer whose lengths the cache that owns it keeps (``owner``): transformers' length queries
    and ``crop`` go to the owner."""

    is_croppable = True

    def __init__(self, owner: StepPlanned) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.owner = owner

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    def get_max_length(self) -> int:
        return self.owner.max_len

    def crop(self, tokens_to_remove: int) -> None:
        self.owner.crop(tokens_to_remove)


class WindowKVLayer(OwnedCacheLayer):  # type: ignore[no-untyped-call]
    """One sliding-window layer's ring of keys and values for every slot (see the module docstring)."""

    is_sliding = True

    def __init__(
        self, owner: StepPlanned, layout: KVLayout, num_slots: int, layer_idx: int, window: int, reach: int
    ) -> None:
        super().__init__(owner)
        if window < 1 or reach < 1:
            raise ValueError(f"a window ring needs window >= 1 and reach >= 1, got {window} and {reach}")
        self.layer_idx = layer_idx
        self.reach = reach
        self.window = window
        self.ring = window - 1 + reach
        shape = (num_slots, layout.num_kv_heads, self.ring + 1, layout.head_dim)  # +1: the discard column
        self.key_ring = torch.zeros(shape, dtype=layout.dtype, device=layout.device)  # [S, H, R+1, D]
        value_shape = (*shape[:3], layout.value_head_dim)
        self.value_ring = torch.zeros(
            value_shape, dtype=layout.dtype, device=layout.device
        )  # [S, H, R+1, Dv]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the rings are allocated at start-up."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys/values ``[B, H, Q, D]`` into the rings; return the window views
        ``[B, H, M + Q, D]`` and register their lengths for the attention (module docstring)."""
        batch = self.owner.plan
        if batch is None:
            raise RuntimeError("WindowKVLayer.update called outside a step: call begin_step() first")
        b, margin = len(batch.query_lens_host), self.window - 1
        device = key_states.device
        first = batch.seq_lens - batch.query_lens  # [B] first query position of each row
        offset = torch.clamp(first - margin, min=0)  # [B]
        before = first - offset  # [B] cached positions shown before the step's own (<= M)
        slots = batch.start + torch.arange(b, device=device)  # [B]
        cols = (offset[:, None] + torch.arange(margin, device=device)) % self.ring  # [B, M]
        view_k = torch.cat([self.key_ring[slots[:, None], :, cols].transpose(1, 2), key_states], dim=2)
        view_v = torch.cat([self.value_ring[slots[:, None], :, cols].transpose(1, 2), value_states], dim=2)
        dest = before[batch.rows] + batch.cols  # [N] the step's keys, right after the row's older ones
        view_k[batch.rows, :, dest] = key_states[batch.rows, :, batch.cols]
        view_v[batch.rows, :, dest] = value_states[batch.rows, :, batch.cols]
        # the ring: positions a long step overwrites itself go to the discard column
        kept = batch.positions >= batch.seq_lens[batch.rows] - self.ring  # [N]
        ring_col = torch.where(kept, batch.positions % self.ring, self.ring)  # [N]
        row_slots = slots[batch.rows]  # [N]
        self.key_ring[row_slots, :, ring_col] = key_states[batch.rows, :, batch.cols].to(self.key_ring.dtype)
        self.value_ring[row_slots, :, ring_col] = value_states[batch.rows, :, batch.cols].to(
            self.value_ring.dtype
        )
        lengths = RaggedAttentionMetadata(batch.query_lens, batch.seq_lens - offset, ring_margin=margin)
        batch.attention.windowed[self.layer_idx] = lengths
        return view_k, view_v

    def move_slot(self, src: int, dst: int) -> None:
        self.key_ring[dst] = self.key_ring[src]
        self.value_ring[dst] = self.value_ring[src]

    def check_rollback(self, slot: int, current: int, length: int) -> None:
        """A rollback from ``current`` to ``length`` positions must stay within the ring's reach."""
        if current - length > self.reach:
            raise RuntimeError(
                f"slot {slot}: a sliding-window layer's ring reaches {self.reach} positions back, asked to "
                f"roll back {current - length} (from {current} to {length})"
            )

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.window - 1 + query_length, 0


__all__ = ["OwnedCacheLayer", "WindowKVLayer"]
