"""Slow reference of :mod:`spec_backend.proposers.suffix_tree`: the original Python-dict suffix trie.

Kept verbatim (class renamed) so the tests can check the compiled trie against it, draft for draft.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["ReferenceSuffixTree"]

HASH_MULT = 0x9E3779B97F4A7C15  # odd 64-bit multiplier
HASH_MASK = (1 << 64) - 1
M32 = (1 << 32) - 1
_INT_BYTES = 36  # a CPython int object holding a 64-bit hash
_ENTRY_BYTES = 36 + 40  # key int + packed value int (~96 bits); the table itself is measured


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


class ReferenceSuffixTree:
    """Suffix trie of depth ``max_depth`` with occurrence counts; see the module docstring."""

    def __init__(self, max_depth: int, removable: bool = False) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth={max_depth} must be >= 1")
        self.max_depth = max_depth
        self.nodes: dict[int, int] = {}  # node hash -> packed (count, best child, best child's count)
        self.kids: dict[int, list[int]] | None = {} if removable else None  # node -> child tokens

    @property
    def num_nodes(self) -> int:
        """Number of non-root nodes stored."""
        return len(self.nodes)

    @property
    def memory_bytes(self) -> int:
        """Estimated bytes: the hash table plus its key/value ints (and child lists if removable)."""
        total = sys.getsizeof(self.nodes) + _ENTRY_BYTES * len(self.nodes)
        if self.kids is not None:
            total += sys.getsizeof(self.kids) + _INT_BYTES * len(self.kids)
            total += sum(sys.getsizeof(v) for v in self.kids.values())
        return total

    def count(self, node: int) -> int:
        """Occurrences of ``node`` (0 if absent)."""
        return self.nodes.get(node, 0) & M32

    def best_child(self, node: int) -> int | None:
        """Most frequent child token of ``node`` (None for a leaf or an absent node)."""
        best = (self.nodes.get(node, 0) >> 32 & M32) - 1
        return None if best < 0 else best

    # ------------------------------------------------------------------------------------ bulk build
    def insert(self, tokens: Sequence[int]) -> None:
        """Insert every suffix of ``tokens`` (cut at max_depth): counts of all its substrings += 1."""
        arr = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [L]
        if arr.shape[0] == 0:
            return
        nodes, parents, toks, ends = substring_table(arr, self.max_depth)
        uniq, first, counts = np.unique(nodes, return_index=True, return_counts=True)  # [U]
        if not self.nodes and self.kids is None:
            self._build_fresh(uniq, parents[first], toks[first], counts, nodes, ends)
            return
        table, kids = self.nodes, self.kids
        for node, parent, tok, c in zip(
            uniq.tolist(), parents[first].tolist(), toks[first].tolist(), counts.tolist(), strict=True
        ):
            old = table.get(node, 0)
            table[node] = old + c
            if parent == 0:
                continue
            value = table.get(parent, 0)  # the parent may come later in this loop: counts add up
            best = (value >> 32 & M32) - 1
            if kids is not None and old & M32 == 0 and best >= 0:  # a second (or further) child
                siblings = kids.get(parent)
                if siblings is None:
                    kids[parent] = [best, tok]
                else:
                    siblings.append(tok)
            child_count = (old & M32) + c
            if best == tok or child_count >= value >> 64:  # ties go to the most recent child
                table[parent] = pack(value & M32, tok, child_count)

    def _build_fresh(
        self,
        uniq: npt.NDArray[np.uint64],
        parents: npt.NDArray[np.uint64],
        toks: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
        nodes: npt.NDArray[np.uint64],
        ends: npt.NDArray[np.int64],
    ) -> None:
        """Vectorised construction of an empty tree: ``uniq/parents/toks/counts`` are [U] per node."""
        inverse = np.searchsorted(uniq, nodes)  # [N] occurrence -> unique node
        last_end = np.full(uniq.shape[0], -1, dtype=np.int64)  # [U]
        np.maximum.at(last_end, inverse, ends)
        # best child per parent: highest count, then latest occurrence (the last of each parent's run)
        keep = np.flatnonzero(parents != 0)  # [U']
        order = keep[np.lexsort((last_end[keep], counts[keep], parents[keep]))]
        tail = np.ones(order.shape[0], dtype=bool)
        tail[:-1] = parents[order[1:]] != parents[order[:-1]]
        winners = order[tail]  # one child per parent
        parent_idx = np.searchsorted(uniq, parents[winners])  # [W] rows of the parents
        low = counts.astype(np.uint64)  # [U]: count | (best + 1) << 32
        low[parent_idx] |= (toks[winners].astype(np.uint64) + np.uint64(1)) << np.uint64(32)
        high = np.zeros(uniq.shape[0], dtype=np.int64)  # [U]: best child's count
        high[parent_idx] = counts[winners]
        packed = [lo | hi << 64 if hi else lo for lo, hi in zip(low.tolist(), high.tolist(), strict=True)]
        self.nodes = dict(zip(uniq.tolist(), packed, strict=True))

    # ------------------------------------------------------------------------------------- removal
    def remove(self, tokens: Sequence[int]) -> None:
        """Undo :meth:`insert` of the same ``tokens`` exactly (needs ``removable=True``)."""
        if self.kids is None:
            raise RuntimeError("this SuffixTree was built without removable=True")
        arr = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [L]
        if arr.shape[0] == 0:
            return
        nodes, parents, toks, _ = substring_table(arr, self.max_depth)
        uniq, first, counts = np.unique(nodes, return_index=True, return_counts=True)  # [U]
        table, kids = self.nodes, self.kids
        stale: set[int] = set()
        for node, parent, tok, c in zip(
            uniq.tolist(), parents[first].tolist(), toks[first].tolist(), counts.tolist(), strict=True
        ):
            value = table[node]
            if value & M32 > c:
                table[node] = value - c
            else:
                del table[node]
                kids.pop(node, None)
                siblings = kids.get(parent) if parent != 0 else None
                if siblings is not None:  # None: an only child, or the parent itself is gone
                    siblings.remove(tok)
            if parent != 0:
                stale.add(parent)  # its best child, or that child's count, may have changed
        for parent in stale:
            self._recompute_best(parent)

    def _recompute_best(self, parent: int) -> None:
        """Re-derive ``parent``'s best child after removals; drop child lists of fewer than two."""
        assert self.kids is not None
        table = self.nodes
        value = table.get(parent)
        tokens = self.kids.get(parent)
        if value is None:
            self.kids.pop(parent, None)
            return
        if tokens is None:  # at most one child: the recorded best, if it still exists
            best = (value >> 32 & M32) - 1
            count = table.get(child_hash(parent, best), 0) & M32 if best >= 0 else 0
            table[parent] = pack(value & M32, best, count) if count else value & M32
            return
        if not tokens:  # every child was removed
            table[parent] = value & M32
            del self.kids[parent]
            return
        counts = [table[child_hash(parent, t)] & M32 for t in tokens]
        i = max(range(len(tokens) - 1, -1, -1), key=counts.__getitem__)  # ties: latest added child
        table[parent] = pack(value & M32, tokens[i], counts[i])
        if len(tokens) < 2:
            del self.kids[parent]
