"""Depth-limited suffix trie with frequency counts, stored in a compiled open-addressing hash table.

A node is a token string ``s`` with ``1 <= len(s) <= max_depth``; its count is the number of times ``s``
occurs in the inserted sequences (each inserted suffix, cut at ``max_depth``, passes through it once).
The child of ``s`` by token ``x`` is ``s + [x]``. Nodes are identified by a 64-bit polynomial hash of
their tokens read left to right, ``h(s + [x]) = h(s) * P + x + 1 (mod 2**64)``, so a child is found
arithmetically and the nodes of every suffix of a growing context are extended in O(1) each. The
root is the empty string, hash 0. A hash collision (probability ~ nodes**2 / 2**64) can only merge two
nodes' statistics; it never affects correctness of decoding, as drafts are verified by the target.

Storage (:mod:`spec_backend.proposers.suffix_kernels`): one row per node in a numpy uint64 table
[capacity, 3] (hash, ``count | (best + 1) << 32``, best child's count), where ``best`` is the node's most
frequent child token (ties go to the most recently counted child), probed and updated by numba
kernels: 24 bytes per slot at a load of at most 3/4 (32-64 bytes per node). Removable trees (the
global cache) add a fourth column and a next-sibling field that link the child tokens of every node
with two or more children, so a best child can be recomputed when counts drop. :attr:`nodes` and
:attr:`kids` rebuild the reference layout (``hash -> count | (best + 1) << 32 | best_count << 64`` and
``hash -> child tokens``; see ``tests/unit/suffix_ref_tree.py``) for inspection.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from spec_backend.proposers import suffix_kernels as kernels

__all__ = ["HASH_MASK", "HASH_MULT", "M32", "SuffixTree", "child_hash", "pack"]

HASH_MULT = 0x9E3779B97F4A7C15  # odd 64-bit multiplier
HASH_MASK = (1 << 64) - 1
M32 = (1 << 32) - 1
_MIN_CAPACITY = 64


def pack(count: int, best: int, best_count: int) -> int:
    """Packed node value; ``best = -1`` for a node without children."""
    return count | (best + 1) << 32 | best_count << 64


def child_hash(node: int, token: int) -> int:
    """Hash of node ``s`` extended by ``token``."""
    return (node * HASH_MULT + token + 1) & HASH_MASK


def substring_table(
    tokens: npt.NDArray[np.int64], max_depth: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Every occurrence of every node of ``tokens`` ([L] int64), vectorised over start positions.

    Returns flat arrays over the ``N = sum_d (L - d + 1)`` occurrences (``d = 1..min(D, L)``):
    node hashes [N] uint64, parent hashes [N] uint64, last token [N] int64, end position [N] int64.
    """
    length = int(tokens.shape[0])
    tok1 = tokens.astype(np.uint64) + np.uint64(1)  # [L]
    nodes, parents, toks, ends = [], [], [], []
    level = tok1.copy()  # [L - d + 1]: hashes of length-d substrings, by start
    prev = np.zeros(length, dtype=np.uint64)  # [L - d + 2]: hashes of length-(d-1) substrings
    mult = np.uint64(HASH_MULT)
    for d in range(1, min(max_depth, length) + 1):
        count = length - d + 1
        nodes.append(level)
        parents.append(prev[:count])
        toks.append(tokens[d - 1 :])
        ends.append(np.arange(d - 1, length, dtype=np.int64))
        prev = level
        with np.errstate(over="ignore"):
            level = level[: count - 1] * mult + tok1[d:]
    return np.concatenate(nodes), np.concatenate(parents), np.concatenate(toks), np.concatenate(ends)


class SuffixTree:
    """Suffix trie of depth ``max_depth`` with occurrence counts; see the module docstring."""

    def __init__(self, max_depth: int, removable: bool = False) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth={max_depth} must be >= 1")
        self.max_depth = max_depth
        self.removable = removable
        self.tab = np.zeros((_MIN_CAPACITY, 4 if removable else 3), dtype=np.uint64)  # see suffix_kernels
        self.meta = np.array([0, 64 - _MIN_CAPACITY.bit_length() + 1], dtype=np.int64)  # used, shift
        self.limit = _MIN_CAPACITY * 3 // 4  # most slots used before growing

    @property
    def num_nodes(self) -> int:
        """Number of non-root nodes stored."""
        return int(self.meta[0])

    @property
    def memory_bytes(self) -> int:
        """Bytes of the node table."""
        return int(self.tab.nbytes + self.meta.nbytes)

    def reserve(self, new_nodes: int) -> None:
        """Grow the table (doubling) so that ``new_nodes`` more nodes keep the load under 3/4."""
        need = int(self.meta[0]) + new_nodes
        if need <= self.limit:
            return
        cap = self.tab.shape[0]
        while need > cap * 3 // 4:
            cap *= 2
        old = self.tab
        self.tab = np.zeros((cap, old.shape[1]), dtype=np.uint64)
        self.meta[1] = 64 - cap.bit_length() + 1
        kernels.rehash(old, self.tab, self.meta)
        self.limit = cap * 3 // 4

    def _rows(self) -> npt.NDArray[np.uint64]:
        rows: npt.NDArray[np.uint64] = self.tab[self.tab[:, 0] != 0]
        return rows

    @property
    def nodes(self) -> dict[int, int]:
        """The table as ``hash -> count | (best + 1) << 32 | best_count << 64`` (a fresh dict)."""
        rows = self._rows()
        low = rows[:, 2] & np.uint64(M32)
        return {
            k: v | c << 64
            for k, v, c in zip(rows[:, 0].tolist(), rows[:, 1].tolist(), low.tolist(), strict=True)
        }

    @property
    def kids(self) -> dict[int, list[int]] | None:
        """Removable trees: ``hash -> child tokens`` of nodes that keep a child list (a fresh dict)."""
        if not self.removable:
            return None
        out: dict[int, list[int]] = {}
        nexts = {
            k: int(r) >> 32 for k, r in zip(self.tab[:, 0].tolist(), self.tab[:, 2].tolist(), strict=True)
        }
        for key, lst in zip(self.tab[:, 0].tolist(), self.tab[:, 3].tolist(), strict=True):
            if key == 0 or lst == 0:
                continue
            tokens, cur = [], lst & M32
            while cur:
                tokens.append(cur - 1)
                cur = nexts[child_hash(key, cur - 1)]
            out[key] = tokens
        return out

    def _value(self, node: int) -> tuple[int, int, int]:
        """(count, best + 1, best_count) of ``node``, zeros if absent."""
        if node == 0:
            return 0, 0, 0
        slot = kernels.lookup(self.tab, self.meta, np.uint64(node & HASH_MASK))
        if slot < 0:
            return 0, 0, 0
        v, c = int(self.tab[slot, 1]), int(self.tab[slot, 2])
        return v & M32, v >> 32, c & M32

    def count(self, node: int) -> int:
        """Occurrences of ``node`` (0 if absent)."""
        return self._value(node)[0]

    def best_child(self, node: int) -> int | None:
        """Most frequent child token of ``node`` (None for a leaf or an absent node)."""
        best = self._value(node)[1] - 1
        return None if best < 0 else best

    # ------------------------------------------------------------------------------------ updates
    def extend(self, active: npt.NDArray[np.uint64], alen: int, tokens: npt.NDArray[np.int64]) -> int:
        """Count ``tokens`` appended to a sequence with suffix hashes ``active[:alen]``; new ``alen``."""
        chunk = max(1, 4096 // self.max_depth)
        for lo in range(0, tokens.shape[0], chunk):
            part = tokens[lo : lo + chunk]
            self.reserve(self.max_depth * part.shape[0])
            alen = kernels.extend(self.tab, self.meta, active, alen, part, self.max_depth)
        return alen

    def insert(self, tokens: Sequence[int]) -> None:
        """Insert every suffix of ``tokens`` (cut at max_depth): counts of all its substrings += 1."""
        arr = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [L]
        if arr.shape[0] == 0:
            return
        if self.num_nodes == 0 and not self.removable:  # as the reference's vectorised fresh build
            self.extend(np.zeros(self.max_depth, dtype=np.uint64), 1, arr)
            return
        nodes, parents, toks, _ = substring_table(arr, self.max_depth)
        uniq, first, counts = np.unique(nodes, return_index=True, return_counts=True)  # [U]
        self.reserve(int(uniq.shape[0]))
        kernels.insert_counts(self.tab, self.meta, uniq, parents[first], toks[first], counts, self.removable)

    def remove(self, tokens: Sequence[int]) -> None:
        """Undo :meth:`insert` of the same ``tokens`` exactly (needs ``removable=True``)."""
        if not self.removable:
            raise RuntimeError("this SuffixTree was built without removable=True")
        arr = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [L]
        if arr.shape[0] == 0:
            return
        nodes, parents, toks, _ = substring_table(arr, self.max_depth)
        uniq, first, counts = np.unique(nodes, return_index=True, return_counts=True)  # [U]
        kernels.remove_counts(self.tab, self.meta, uniq, parents[first], toks[first], counts)
