"""Immutable open-addressing hash table over numpy arrays: vectorised build, O(1) scalar lookups.

Used as the static tier of the n-gram index: ~32 bytes per entry (two 8-byte arrays at load <= 1/2)
instead of ~100 for a Python dict, and lookups without numpy call overhead (reads go through
``memoryview``, which yields Python ints).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["StaticHashTable"]

_FIB = 0x9E3779B97F4A7C15  # Fibonacci hashing multiplier: the top bits of key * _FIB pick the slot
_MASK64 = (1 << 64) - 1


class StaticHashTable:
    """Map distinct uint64 keys to non-negative int64 values; linear probing; -1 means absent."""

    __slots__ = ("_keys", "_keys_mv", "_mask", "_shift", "_vals", "_vals_mv", "size")

    def __init__(self, keys: npt.NDArray[np.uint64], values: npt.NDArray[np.int64]) -> None:
        """``keys``: [N] distinct uint64; ``values``: [N] int64 >= 0."""
        self.size = int(keys.shape[0])
        bits = max(3, int(2 * self.size).bit_length())  # capacity >= 2N: load <= 1/2
        cap = 1 << bits
        self._mask = cap - 1
        self._shift = 64 - bits
        self._keys = np.zeros(cap, dtype=np.uint64)  # [cap]
        self._vals = np.full(cap, -1, dtype=np.int64)  # [cap], -1 = empty
        with np.errstate(over="ignore"):
            slots = ((keys * np.uint64(_FIB)) >> np.uint64(self._shift)).astype(np.int64)  # [N]
        pending = np.arange(self.size)  # [P] entries not placed yet
        while pending.size:  # one probe step per round for every pending entry
            s = slots[pending]  # [P]
            free = self._vals[s] < 0  # [P]
            taken_slots, first = np.unique(s[free], return_index=True)  # first claimant of each free slot
            winners = pending[free][first]
            self._keys[taken_slots] = keys[winners]
            self._vals[taken_slots] = values[winners]
            placed = np.zeros(pending.size, dtype=bool)
            placed[np.flatnonzero(free)[first]] = True
            pending = pending[~placed]
            slots[pending] = (slots[pending] + 1) & self._mask
        self._keys_mv = self._keys.data  # memoryview: item reads give Python ints
        self._vals_mv = self._vals.data

    @classmethod
    def empty(cls) -> StaticHashTable:
        return cls(np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return int(self._keys.nbytes + self._vals.nbytes)

    def get(self, key: int) -> int:
        """Value stored for ``key`` (a Python int in [0, 2**64)), or -1."""
        slot = ((key * _FIB) & _MASK64) >> self._shift
        vals, keys, mask = self._vals_mv, self._keys_mv, self._mask
        while True:
            value: int = vals[slot]
            if value < 0 or keys[slot] == key:
                return value
            slot = (slot + 1) & mask
