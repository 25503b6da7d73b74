"""The slot table: one place that admits, moves, truncates and frees cache slots for every cache.

The target's KV cache and each drafter cache (``Drafter.caches()``) hold a request in the same slot;
live slots stay packed at ``0 .. n-1`` (a leaving request's slot is filled by the last one).
"""

from __future__ import annotations

from collections.abc import Sequence

from spec_backend.runtime.kv_cache import RaggedKVCache
from spec_backend.step import SlotCache


class SlotTable:
    """The target cache plus drafter caches, kept in step (see the module docstring)."""

    def __init__(self, target: RaggedKVCache, drafter_caches: Sequence[SlotCache] = ()) -> None:
        self.target = target
        self.caches: tuple[SlotCache, ...] = (target, *drafter_caches)

    def join(self, cache: SlotCache) -> None:
        """Keep ``cache`` in step with the others from now on (the engine's per-slot state); only while
        no slot is live, so every cache starts from the same slots."""
        if self.num_slots or cache.num_slots:
            raise RuntimeError(f"a cache joins the slot table only while empty ({self.num_slots} live slots)")
        self.caches = (*self.caches, cache)

    @property
    def num_slots(self) -> int:
        """Live slots (the target's count; ``consistent`` checks the others agree)."""
        return self.target.num_slots

    @property
    def capacity(self) -> int:
        """Most requests the preallocated caches hold."""
        return self.target.slot_capacity

    def consistent(self) -> bool:
        """Every cache holds the same slots and no forward is half-way."""
        return self.target.plan is None and all(c.num_slots == self.num_slots for c in self.caches)

    def add(self) -> int:
        """Open one slot at the end of every cache; return its index."""
        slots = {cache.add_slot() for cache in self.caches}
        if len(slots) != 1:
            raise RuntimeError(f"caches disagree on the new slot: {sorted(slots)}")
        return slots.pop()

    def free(self, slot: int) -> None:
        """Free ``slot``: the last slot moves into it, then the last slot is dropped, in every cache."""
        last = self.num_slots - 1
        for cache in self.caches:
            if slot != last:
                cache.move_slot(last, slot)
            cache.pop_slot()

    def truncate(self, slot: int, length: int) -> None:
        """Roll the target's ``slot`` back to ``length`` positions (drafters roll their own back)."""
        self.target.truncate(slot, length)

    def reset(self) -> None:
        """Forget every slot of every cache."""
        for cache in self.caches:
            cache.reset()


__all__ = ["SlotTable"]
