"""Host n-gram (prompt-lookup) proposer with an incremental n-gram index.

Semantics (shared with :mod:`spec_backend.proposers.ngram_gpu`): for a request whose history
(prompt + output) is ``t[0:L]``, take the largest ``n`` in ``[prompt_lookup_min, prompt_lookup_max]``
such that the suffix ``t[L-n:L]`` occurred earlier, i.e. at a start ``s`` with ``s + n <= L - 1``; the
draft is ``t[s+n : s+n+k]`` (clipped at ``L``) for the MOST RECENT such ``s``, with
``k = min(K, max_tokens)``. No earlier occurrence for any ``n`` gives ``[]``.

Index: every n-gram ``t[s:s+n]`` that has a next token is keyed by a 64-bit polynomial hash of its
tokens read from its end, so the keys of the context's suffixes of length 1..n_max are carried from
step to step (one multiply per n per appended token). The value is ``s << 8 | n``. Two tiers keep
memory at ~32 bytes per indexed n-gram for long prompts:

- a static tier: a :class:`~spec_backend.proposers.hash_table.StaticHashTable` (numpy open addressing)
  of the latest start of each key, built vectorised when the request joins and rebuilt when the
  dynamic tier outgrows it;
- a dynamic tier: a dict ``key -> value`` written by :meth:`NgramProposer.update`. Every start in it is
  later than every start in the static tier, and for a fixed ``n`` starts are inserted in increasing
  order, so a dict hit is the most recent occurrence.

A hit counts only if it was stored for the same ``n`` and its tokens equal the suffix; anything else is a
hash collision (never seen with 64-bit keys, but possible) and falls back to an exact vectorised scan of
the history, so results are always exact (tests force collisions with a 3-bit hash).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from spec_backend.config.ngram import MAX_PROMPT_LOOKUP, resolve_lookup_window
from spec_backend.proposers.base import Proposer, draft_limits, speculative_tokens
from spec_backend.proposers.hash_table import StaticHashTable

if TYPE_CHECKING:
    import torch

    from spec_backend.config import SpeculativeConfig

__all__ = ["NgramProposer", "build_ngram_proposer", "continuation_tree", "last_occurrence", "occurrences"]

_P = 0x100000001B3  # odd multiplier of the polynomial hash (64-bit FNV prime)
_MASK64 = (1 << 64) - 1
_MIN_DYNAMIC = 512  # the dynamic tier is merged into the static tier past max(this, static size / 2)
MAX_LOOKUP = MAX_PROMPT_LOOKUP
_NBITS = MAX_LOOKUP.bit_length()  # values are ``start << _NBITS | n`` (inlined in update); other n: collision

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]


def last_occurrence(tokens: npt.NDArray[np.integer[Any]], n: int) -> int:
    """Most recent start ``s`` with ``tokens[s:s+n] == tokens[L-n:]`` and ``s + n <= L - 1``; -1 if none.

    ``tokens``: [L] integer. Exact O(L * n) vectorised scan, used as the collision fallback and in tests.
    """
    length = tokens.shape[0]
    if n < 1 or n + 1 > length:
        return -1
    windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)  # [L - n, n]
    hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))  # [#matches]
    return int(hits[-1]) if hits.size else -1


def occurrences(tokens: npt.NDArray[np.integer[Any]], n: int) -> I64:
    """Every start ``s`` with ``tokens[s:s+n] == tokens[L-n:]`` and ``s + n <= L - 1``, most recent
    first (``last_occurrence``'s scan, all hits)."""
    length = tokens.shape[0]
    if n < 1 or n + 1 > length:
        return np.zeros(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)  # [L - n, n]
    return np.flatnonzero((windows == tokens[length - n :]).all(axis=1))[::-1].astype(np.int64)


def continuation_tree(
    tokens: npt.NDArray[np.integer[Any]],  # [L]
    nexts: I64,  # [M] where each continuation starts, most recent first
    parents: Sequence[int],
    ranks: Sequence[int],
) -> tuple[tuple[int, ...], list[int]]:
    """The static tree's nodes found among the continuations ``tokens[c:]`` (``NgramProposer.propose_tree``):
    a node's candidates are the distinct tokens that follow its path, in the order of the continuations
    that reach them first; nodes past the candidates (and their subtrees) are absent."""
    length = tokens.shape[0]
    reach: dict[int, list[int]] = {-1: [int(c) for c in nexts]}  # plan node -> continuation offsets there
    kept: dict[int, int] = {}  # plan node -> its index among the kept
    out_parents: list[int] = []
    out_tokens: list[int] = []
    for node, (parent, rank) in enumerate(zip(parents, ranks, strict=True)):
        if parent not in reach:
            continue  # the parent is absent
        order: dict[int, list[int]] = {}  # candidate -> the continuations taking it, in order
        for c in reach[parent]:
            if c < length:
                order.setdefault(int(tokens[c]), []).append(c + 1)
        if rank >= len(order):
            continue
        token, followers = list(order.items())[rank]
        kept[node] = len(out_tokens)
        out_parents.append(kept[parent] if parent >= 0 else -1)
        out_tokens.append(token)
        reach[node] = followers
    return tuple(out_parents), out_tokens


class _RequestIndex:
    """One request's tokens and two-tier n-gram index."""

    __slots__ = ("dyn", "keys", "static", "tokens")

    def __init__(self, prompt: Sequence[int]) -> None:
        # a list, not an array: the hot path only slices short runs, which lists do without numpy overhead
        self.tokens: list[int] = [int(t) for t in prompt]  # [L]
        self.dyn: dict[int, int] = {}
        self.static = StaticHashTable.empty()
        self.keys: list[int] = []  # keys[n - 1]: key of the context's length-n suffix, n <= n_max

    def nbytes(self) -> int:
        """Estimate: list slots + int objects, dict entries (~100 B each, CPython 3.11), static table."""
        return 36 * len(self.tokens) + 100 * len(self.dyn) + self.static.nbytes


class NgramProposer(Proposer):
    """Prompt-lookup drafting on the host (numpy); O(n_max) dict work per token and per proposal."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens={num_speculative_tokens} must be >= 1")
        if not 1 <= prompt_lookup_min <= prompt_lookup_max <= MAX_LOOKUP:
            raise ValueError(
                f"need 1 <= prompt_lookup_min={prompt_lookup_min} <= prompt_lookup_max={prompt_lookup_max}"
                f" <= {MAX_LOOKUP}"
            )
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max
        self._mask = _MASK64  # tests shrink it to force hash collisions
        self._short = _MIN_DYNAMIC  # prompts of at most this many n-grams go to the dynamic tier (tests: -1)
        self._reqs: dict[str, _RequestIndex] = {}

    # ----------------------------------------------------------------------------------------- state
    def add_request(self, req_id: str, prompt_token_ids: Sequence[int]) -> None:
        """Index the prompt: vectorised (O(P * n_max) numpy work), or, a prompt of at most ``_MIN_DYNAMIC``
        n-grams, into the dynamic tier as ``update`` does: the vectorised build's ~40 numpy calls cost
        ~0.3 ms in a tight loop and 0.7-1 ms between two forwards whatever the length (up to ~8 % of a
        SmolLM2 decode step on the AVX2 demo machine, at every admission), ``update`` ~1 µs an n-gram."""
        if len(prompt_token_ids) * (self.prompt_lookup_max - self.prompt_lookup_min + 1) <= self._short:
            self._reqs[req_id] = index = _RequestIndex(())
            self._append(index, prompt_token_ids)
            return
        index = _RequestIndex(prompt_token_ids)
        self._rebuild_static(index)
        h, pw = 0, 1
        for tok in reversed(index.tokens[max(0, len(index.tokens) - self.prompt_lookup_max) :]):
            h = (h + (tok + 1) * pw) & self._mask
            pw = (pw * _P) & _MASK64
            index.keys.append(h)
        self._reqs[req_id] = index

    def update(self, req_id: str, new_token_ids: Sequence[int]) -> None:
        """Append tokens; index each n-gram that gains a next token (n_max dict writes per token)."""
        self._append(self._reqs[req_id], new_token_ids)

    def _append(self, index: _RequestIndex, new_token_ids: Sequence[int]) -> None:
        if len(new_token_ids) == 0:  # a numpy array has no truth value
            return
        new = [int(t) for t in new_token_ids]
        p = len(index.tokens)
        n_min, n_max, mask, mult = self.prompt_lookup_min, self.prompt_lookup_max, self._mask, _P
        dyn, keys = index.dyn, index.keys
        for tok in new:  # tok lands at position p and gives the suffix n-grams a next token
            for n in range(n_min, len(keys) + 1):
                dyn[keys[n - 1]] = (p - n) << 8 | n
            x1 = tok + 1
            keys = [x1 & mask] + [(x1 + mult * k) & mask for k in keys[: n_max - 1]]
            p += 1
        index.keys = keys
        index.tokens.extend(new)
        if len(dyn) > max(_MIN_DYNAMIC, index.static.size // 2):
            self._rebuild_static(index)

    def remove_request(self, req_id: str) -> None:
        self._reqs.pop(req_id, None)

    @property
    def num_requests(self) -> int:
        return len(self._reqs)

    @property
    def memory_bytes(self) -> int:
        """Estimated host bytes held by all requests' buffers and indexes."""
        return sum(index.nbytes() for index in self._reqs.values())

    # ---------------------------------------------------------------------------------------- propose
    def propose(self, req_ids: Sequence[str], max_tokens: Sequence[int] | None = None) -> list[list[int]]:
        limits = draft_limits(self.num_speculative_tokens, len(req_ids), max_tokens)
        return [
            self._propose_one(self._reqs[r], k) if k > 0 else [] for r, k in zip(req_ids, limits, strict=True)
        ]

    def _propose_one(self, index: _RequestIndex, k: int) -> list[int]:
        tokens, n_min, keys = index.tokens, self.prompt_lookup_min, index.keys
        length = len(tokens)
        n_top = min(self.prompt_lookup_max, length - 1)
        if n_top < n_min:
            return []
        dyn, static = index.dyn, index.static
        for n in range(n_top, n_min - 1, -1):
            key = keys[n - 1]
            val = dyn.get(key, -1)
            if val < 0:
                val = static.get(key)
            if val < 0:
                continue
            start = val >> _NBITS
            if val & MAX_LOOKUP == n and tokens[start : start + n] == tokens[length - n :]:
                return tokens[start + n : start + n + k]
            start = last_occurrence(np.asarray(tokens, dtype=np.int64), n)  # hash collision: exact scan
            if start >= 0:
                return tokens[start + n : start + n + k]
        return []

    def propose_tree(
        self, req_id: str, parents: Sequence[int], ranks: Sequence[int]
    ) -> tuple[tuple[int, ...], list[int]]:
        """Several continuations found in the context (``ngram_tree``): node ``(…, r)`` is the ``r``-th
        distinct next token after its path among the occurrences of the longest matching suffix, the
        most recent first — so the rank-0 path is ``propose``'s chain."""
        index = self._reqs[req_id]
        tokens = np.asarray(index.tokens, dtype=np.int64)  # [L]
        for n in range(min(self.prompt_lookup_max, tokens.shape[0] - 1), self.prompt_lookup_min - 1, -1):
            starts = occurrences(tokens, n)  # most recent first
            if starts.size:
                return continuation_tree(tokens, starts + n, parents, ranks)
        return (), []

    def _rebuild_static(self, index: _RequestIndex) -> None:
        """Index every n-gram with a next token into sorted arrays; empty the dynamic tier."""
        tokens = np.asarray(index.tokens, dtype=np.uint64) + np.uint64(1)  # [L]
        length = tokens.shape[0]
        all_keys: list[U64] = []
        all_vals: list[I64] = []
        h = np.zeros(0, dtype=np.uint64)
        pw = 1
        for n in range(1, min(self.prompt_lookup_max, length - 1) + 1):
            count = length - n  # starts s = 0 .. L - n - 1
            # keys of windows [s, s + n): previous windows' keys (shifted by one start) + new first token
            with np.errstate(over="ignore"):
                h = h[1 : count + 1] + tokens[:count] * np.uint64(pw) if n > 1 else tokens[:count].copy()
            pw = (pw * _P) & _MASK64
            if n >= self.prompt_lookup_min:
                all_keys.append(h & np.uint64(self._mask))
                all_vals.append(np.arange(count, dtype=np.int64) << _NBITS | n)
        index.dyn = {}
        if not all_keys:
            index.static = StaticHashTable.empty()
            return
        keys = np.concatenate(all_keys)  # [N]
        vals = np.concatenate(all_vals)  # [N]
        order = np.lexsort((vals, keys))  # by key, then start: the last of each run is the latest start
        keys, vals = keys[order], vals[order]
        last = np.ones(keys.shape[0], dtype=bool)  # [N]
        last[:-1] = keys[1:] != keys[:-1]
        index.static = StaticHashTable(keys[last], vals[last])


def build_ngram_proposer(config: SpeculativeConfig, device: torch.device | None = None) -> NgramProposer:
    """The ``ngram`` method's proposer from a validated config (a host algorithm: ``device`` is unused)."""
    lo, hi = resolve_lookup_window("ngram", config.prompt_lookup_min, config.prompt_lookup_max)
    return NgramProposer(speculative_tokens(config), lo, hi)
