"""Compiled (numba) kernels of the suffix trie: an open-addressing hash table of nodes, by node hash.

Table ``tab``: uint64 [cap, W], ``cap`` a power of two, linear probing, key 0 = empty slot (the root,
hash 0, is never stored). Columns:

- 0: the node's hash (see :mod:`spec_backend.proposers.suffix_tree`);
- 1: ``count | (best + 1) << 32``: occurrences, and the most frequent child token + 1 (0: none);
- 2: ``best_count | (next + 1) << 32``: the best child's count, and (removable trees) the token + 1 of
  the node's next sibling in its parent's child list (0: last);
- 3 (removable trees, W = 4): ``(head + 1) | (tail + 1) << 32`` of the node's child list, kept (like
  the reference's ``kids``) only for nodes that have had two or more children (0: no list).

``meta``: int64 [2] = (used slots, hash shift = 64 - log2(cap)). The caller guarantees free room before
each call (:meth:`SuffixTree._reserve`), so probing always ends. Each kernel mirrors, operation for
operation, the dict code of ``tests/unit/suffix_ref.py`` / ``suffix_ref_tree.py`` (same
hashes, same tie-breaks, same float operations), so counts, best children and drafts are identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np

__all__ = ["extend", "insert_counts", "lookup", "propose_one", "rehash", "remove_counts"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(fn: _F) -> _F:
    return cast(_F, numba.njit(cache=True, nogil=True)(fn))


_MULT = np.uint64(0x9E3779B97F4A7C15)  # = suffix_tree.HASH_MULT
_MIX = np.uint64(0xD6E8FEB86659FD93)  # slot mixing: a node hash's low bits are poorly mixed
_LO = np.uint64(0xFFFFFFFF)
_HI = np.uint64(0xFFFFFFFF00000000)
_S32 = np.uint64(32)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


@_jit
def _slot(key: Any, shift: Any) -> Any:
    return np.int64(((key ^ (key >> _S32)) * _MIX) >> shift)


@_jit
def _find(tab: Any, meta: Any, key: Any) -> Any:
    """Slot of ``key``, inserted (zeroed row) if absent."""
    mask = tab.shape[0] - 1
    i = _slot(key, np.uint64(meta[1]))
    while True:
        k = tab[i, 0]
        if k == key:
            return i
        if k == _ZERO:
            tab[i, 0] = key
            meta[0] += 1
            return i
        i = (i + 1) & mask


@_jit
def _get(tab: Any, meta: Any, key: Any) -> Any:
    """Slot of ``key``, or -1."""
    mask = tab.shape[0] - 1
    i = _slot(key, np.uint64(meta[1]))
    while True:
        k = tab[i, 0]
        if k == key:
            return i
        if k == _ZERO:
            return -1
        i = (i + 1) & mask


@_jit
def lookup(tab: Any, meta: Any, key: Any) -> int:
    """Slot of ``key`` (uint64), or -1."""
    return int(_get(tab, meta, key))


@_jit
def _delete(tab: Any, meta: Any, i: Any) -> None:
    """Remove slot ``i`` (backward-shift deletion: no tombstones)."""
    mask = tab.shape[0] - 1
    shift = np.uint64(meta[1])
    j = i
    while True:
        j = (j + 1) & mask
        k = tab[j, 0]
        if k == _ZERO:
            break
        home = _slot(k, shift)
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            tab[i, :] = tab[j, :]
            i = j
    tab[i, :] = 0
    meta[0] -= 1


@_jit
def rehash(old: Any, new: Any, meta: Any) -> None:
    """Move every node of ``old`` into the empty ``new`` (``meta`` already describes ``new``)."""
    meta[0] = 0
    for i in range(old.shape[0]):
        if old[i, 0] != _ZERO:
            new[_find(new, meta, old[i, 0]), :] = old[i, :]


@_jit
def extend(tab: Any, meta: Any, active: Any, alen: int, tokens: Any, depth: int) -> int:
    """Append ``tokens`` to a sequence whose suffix hashes are ``active[:alen]``; returns the new alen.

    Per token: +1 on the node of every suffix of length 1..D ending at it, and its parent's best child
    is this token if its count reaches the best count (ties: the most recent). ``active`` [depth]
    uint64 holds the hashes of the last 0..alen-1 tokens (``active[0] = 0``, the root).
    """
    for j in range(tokens.shape[0]):
        x1 = np.uint64(tokens[j] + 1)
        tab[_find(tab, meta, x1), 1] += _ONE
        carry = active[1] if alen > 1 else _ZERO
        if depth > 1:
            active[1] = x1
        for d in range(1, alen):  # parents at depth d (increasing, as the reference), children at d + 1
            parent = carry
            if d + 1 < alen:
                carry = active[d + 1]
            child = parent * _MULT + x1
            c = _find(tab, meta, child)
            tab[c, 1] += _ONE
            count = tab[c, 1] & _LO
            p = _get(tab, meta, parent)
            pv = tab[p, 1]
            if pv >> _S32 == x1 or count >= tab[p, 2] & _LO:
                tab[p, 1] = (pv & _LO) | (x1 << _S32)
                tab[p, 2] = (tab[p, 2] & _HI) | count
            if d + 1 < depth:
                active[d + 1] = child
        alen = min(alen + 1, depth)
    return alen


@_jit
def _set_next(tab: Any, meta: Any, parent: Any, tok1: Any, next1: Any) -> None:
    c = _get(tab, meta, parent * _MULT + tok1)
    tab[c, 2] = (tab[c, 2] & _LO) | (next1 << _S32)


@_jit
def insert_counts(tab: Any, meta: Any, nodes: Any, parents: Any, toks: Any, counts: Any, kids: bool) -> None:
    """Add ``counts`` [U] to the distinct ``nodes`` [U] (in this order), as the reference's insert loop."""
    for u in range(nodes.shape[0]):
        tok1 = np.uint64(toks[u] + 1)
        c = np.uint64(counts[u])
        i = _find(tab, meta, nodes[u])
        old = tab[i, 1] & _LO
        tab[i, 1] += c
        parent = parents[u]
        if parent == _ZERO:
            continue
        p = _get(tab, meta, parent)
        best1 = tab[p, 1] >> _S32 if p >= 0 else _ZERO
        best_count = tab[p, 2] & _LO if p >= 0 else _ZERO
        if kids and old == _ZERO and best1 != _ZERO:  # a second (or further) child: list it
            lst = tab[p, 3]
            if lst == _ZERO:
                tab[p, 3] = best1 | (tok1 << _S32)
                _set_next(tab, meta, parent, best1, tok1)
            else:
                _set_next(tab, meta, parent, lst >> _S32, tok1)
                tab[p, 3] = (lst & _LO) | (tok1 << _S32)
            tab[i, 2] &= _LO
        child_count = old + c
        if best1 == tok1 or child_count >= best_count:  # ties go to the most recent child
            if p < 0:
                p = _find(tab, meta, parent)
            tab[p, 1] = (tab[p, 1] & _LO) | (tok1 << _S32)
            tab[p, 2] = (tab[p, 2] & _HI) | child_count


@_jit
def _unlink(tab: Any, meta: Any, p: Any, parent: Any, tok1: Any, next1: Any) -> None:
    """Drop ``tok1`` (whose next pointer was ``next1``) from the child list of slot ``p``."""
    lst = tab[p, 3]
    head1, tail1 = lst & _LO, lst >> _S32
    prev, cur = _ZERO, head1
    while cur != tok1:
        prev = cur
        cur = tab[_get(tab, meta, parent * _MULT + cur), 2] >> _S32
    if prev == _ZERO:
        head1 = next1
    else:
        _set_next(tab, meta, parent, prev, next1)
    if tail1 == tok1:
        tail1 = prev
    tab[p, 3] = _ZERO if head1 == _ZERO else head1 | (tail1 << _S32)


@_jit
def _recompute_best(tab: Any, meta: Any, parent: Any) -> None:
    """Re-derive ``parent``'s best child after removals; drop child lists of fewer than two."""
    p = _get(tab, meta, parent)
    if p < 0:
        return
    pv = tab[p, 1]
    lst = tab[p, 3]
    if lst == _ZERO:  # at most one child: the recorded best, if it still exists
        best1 = pv >> _S32
        count = _ZERO
        if best1 != _ZERO:
            c = _get(tab, meta, parent * _MULT + best1)
            if c >= 0:
                count = tab[c, 1] & _LO
        if count == _ZERO:
            tab[p, 1] = pv & _LO
        tab[p, 2] = (tab[p, 2] & _HI) | count
        return
    cur, n, bt, bc, last = lst & _LO, 0, _ZERO, _ZERO, -1
    while cur != _ZERO:
        last = _get(tab, meta, parent * _MULT + cur)
        cc = tab[last, 1] & _LO
        if n == 0 or cc >= bc:  # ties: the latest listed child
            bt, bc = cur, cc
        n += 1
        cur = tab[last, 2] >> _S32
    tab[p, 1] = (pv & _LO) | (bt << _S32)
    tab[p, 2] = (tab[p, 2] & _HI) | bc
    if n < 2:
        tab[p, 3] = _ZERO
        if last >= 0:
            tab[last, 2] &= _LO


@_jit
def remove_counts(tab: Any, meta: Any, nodes: Any, parents: Any, toks: Any, counts: Any) -> None:
    """Subtract ``counts`` [U] from the distinct ``nodes`` [U] (removable trees), then fix best children."""
    for u in range(nodes.shape[0]):
        c = np.uint64(counts[u])
        parent = parents[u]
        i = _get(tab, meta, nodes[u])
        if tab[i, 1] & _LO > c:
            tab[i, 1] -= c
        else:
            next1 = tab[i, 2] >> _S32
            _delete(tab, meta, i)
            if parent != _ZERO:
                p = _get(tab, meta, parent)
                if p >= 0 and tab[p, 3] != _ZERO:
                    _unlink(tab, meta, p, parent, np.uint64(toks[u] + 1), next1)
    for u in range(nodes.shape[0]):  # recomputing is idempotent and per parent: order does not matter
        if parents[u] != _ZERO:
            _recompute_best(tab, meta, parents[u])


@_jit
def _search(
    tab: Any,
    meta: Any,
    active: Any,
    alen: int,
    k: int,
    own: bool,
    floor: float,
    depth: int,
    factor: float,
    min_prob: float,
    out: Any,
    tmp: Any,
) -> Any:
    """Best (score, length) of a draft scoring > ``floor``, written to ``out``; else (floor, 0)."""
    own_i = 1 if own else 0
    budgets = np.zeros(alen, np.int64)
    top = 0
    for m in range(1, alen):
        budgets[m] = min(k, int(factor * m), depth - m)
        top = max(top, budgets[m])
    best_score, best_len = floor, 0
    walked_b = np.zeros(alen, np.int64)
    walked_c = np.zeros(alen, np.int64)
    nw = 0
    for budget in range(top, 0, -1):  # largest budget first, then longest match
        if budget <= best_score:
            break  # a draft scores at most its length: nothing left can win
        for m in range(alen - 1, 0, -1):
            if budgets[m] != budget:
                continue
            node = active[m]
            s = _get(tab, meta, node)
            if s < 0:
                continue
            parent_count = np.int64(tab[s, 1] & _LO) - own_i
            if parent_count <= 0:
                continue  # no earlier occurrence of this context
            seen = False
            for w in range(nw):
                if walked_b[w] == budget and walked_c[w] == parent_count:
                    seen = True  # same occurrences as a longer match: same walk
            if seen:
                continue
            walked_b[nw], walked_c[nw] = budget, parent_count
            nw += 1
            d, n, score, cum = m, 0, 0.0, 1.0
            while n < budget:
                tok1 = tab[s, 1] >> _S32
                if tok1 == _ZERO:
                    break
                child_count = np.int64(tab[s, 2] & _LO)
                cum *= child_count / parent_count
                if cum < min_prob:
                    break
                tmp[n] = np.int64(tok1) - 1
                n += 1
                score += cum
                node = node * _MULT + tok1
                s = _get(tab, meta, node)
                d += 1
                parent_count = child_count - (own_i if d < alen and active[d] == node else 0)
                if s < 0 or parent_count <= 0:
                    break
            if score > best_score:
                best_score, best_len = score, n
                out[:n] = tmp[:n]
    return best_score, best_len


@_jit
def propose_one(
    tab: Any,
    meta: Any,
    gtab: Any,
    gmeta: Any,
    use_global: bool,
    active: Any,
    alen: int,
    k: int,
    depth: int,
    factor: float,
    min_prob: float,
    out: Any,
) -> int:
    """Draft length written to ``out``: the request tree's best, replaced by the global tree's if better."""
    tmp = np.empty(k, np.int64)
    score, n = _search(tab, meta, active, alen, k, True, 0.0, depth, factor, min_prob, out, tmp)
    if use_global:
        gout = np.empty(k, np.int64)
        _, g = _search(gtab, gmeta, active, alen, k, False, score, depth, factor, min_prob, gout, tmp)
        if g > 0:
            out[:g] = gout[:g]
            n = g
    return int(n)
