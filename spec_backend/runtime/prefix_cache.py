"""Automatic prefix caching: the KV of prompt prefixes that requests share is computed once.

Glossary:

* *block* — ``block_size`` consecutive prompt positions, aligned to the prompt's start. A block is
  keyed by its content: its parent block (the one before it; for the first, the request's *salt* or
  none) and its token ids, so a block is found only after the same tokens at the same positions under
  the same salt, and equal keys mean equal tokens (the key is the content itself, never a digest that
  could collide).
* *salt* — ``cache_salt``: a string only requests that share it share blocks under (tenants' isolation).
* *entry* — a stored block: for each prefix-cacheable cache (the target's, then the drafter's that are
  a function of the tokens alone, such as a draft model's), its keys and values of those positions, and
  the target hidden states of those positions the drafter declared (``HiddenStateRequest``). A drafter
  cache may be missing from an entry (the drafter had not filled it when the entry was stored).
* *hit* — the positions a new request takes from entries: the longest chain of stored blocks its
  prompt starts with, at most ``prompt length - 1`` (the last prompt position is always computed: its
  logits pick the first output token). A hit may end inside a block.

A hit copies the entries' keys and values into the request's slot (``RaggedKVCache.append_positions``)
and the prefill computes only the rest. Positions' keys and values depend only on the tokens up to them
(causal attention), so a hit gives the same cache as computing it. Entries are stored after each
prefill, from the slot, for every whole block of the prompt. Eviction is least-recently-used under
``max_bytes``; evicting an entry evicts the blocks stored after it (unreachable without it); a prompt's
own chain is never evicted to store its later blocks (they are not stored when it fills the budget).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spec_backend.runtime.kv_cache import RaggedKVCache

#: the content key of a block: its parent's entry id (for the first block: ``-1``, or the salt) and its
#: token ids
BlockKey = tuple[int | str, tuple[int, ...]]


@dataclass
class Entry:
    """One stored block (module docstring)."""

    id: int
    key: BlockKey
    kv: list[tuple[torch.Tensor, torch.Tensor] | None]  # per cache: [layers, H, bs, D], [layers, H, bs, Dv]
    final: torch.Tensor | None  # [bs, H] the target's post-norm hidden states
    aux: torch.Tensor | None  # [bs, n_aux, H] the target's aux hidden states
    nbytes: int
    children: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Hit:
    """What a request takes from the prefix cache: ``length`` positions from ``entries`` (in order)."""

    length: int
    entries: tuple[Entry, ...]

    def hidden(self, which: str) -> torch.Tensor | None:
        """The stored hidden states ``which`` (``"final"`` ``[P, H]`` or ``"aux"`` ``[P, n, H]``) of the
        hit's positions."""
        parts = [getattr(e, which) for e in self.entries]
        if not parts or any(p is None for p in parts):
            return None
        return torch.cat(parts)[: self.length]


NO_HIT = Hit(0, ())


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class PrefixCache:
    """Stored prompt blocks of ``caches`` (``caches[0]``: the target's), at most ``max_bytes`` of them.

    ``needs_hidden``: entries must carry the target hidden states (a drafter reads them for every
    prompt position); ``block_size``: positions per block.
    """

    def __init__(
        self, caches: Sequence[RaggedKVCache], block_size: int, max_bytes: int, needs_hidden: bool
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        per_block = block_size * sum(c.layout.bytes_per_position for c in caches)
        if max_bytes < per_block:
            raise ValueError(
                f"prefix_cache_memory_bytes={max_bytes} cannot hold one block of {block_size} positions "
                f"({per_block} bytes of KV cache); raise it to >= {per_block}, or disable prefix caching"
            )
        self.caches = tuple(caches)
        self.block_size = block_size
        self.max_bytes = max_bytes
        self.needs_hidden = needs_hidden
        self.nbytes = 0
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._by_key: dict[BlockKey, Entry] = {}
        self._next_id = 0
        self.queried_tokens = 0  # prompt tokens looked up, and those served from the cache
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _keys(self, tokens: Sequence[int], count: int) -> list[tuple[int, ...]]:
        bs = self.block_size
        return [tuple(tokens[i * bs : (i + 1) * bs]) for i in range(count)]

    def lookup(self, tokens: Sequence[int], salt: str | None = None) -> Hit:
        """The hit for a prompt ``tokens`` under ``salt`` (module docstring); its entries become most
        recently used."""
        limit = len(tokens) - 1
        chain: list[Entry] = []
        parent: int | str = -1 if salt is None else salt
        for block in self._keys(tokens, -(-limit // self.block_size) if limit > 0 else 0):
            entry = self._by_key.get((parent, block))
            if entry is None:
                break
            chain.append(entry)
            parent = entry.id
        self._touch(chain)
        hit = Hit(min(len(chain) * self.block_size, max(limit, 0)), tuple(chain)) if chain else NO_HIT
        self.queried_tokens += len(tokens)
        self.hit_tokens += hit.length
        return hit

    def load(self, slot: int, hit: Hit) -> list[int]:
        """Copy ``hit`` into slot ``slot`` of every cache (empty slots); return each cache's new length.
        A drafter cache takes the entries up to the first that lacks it."""
        lengths = []
        for i, cache in enumerate(self.caches):
            parts = []
            for entry in hit.entries:
                kv = entry.kv[i]
                if kv is None:
                    break
                parts.append(kv)
            n = min(hit.length, len(parts) * self.block_size)
            if n > 0:
                keys = torch.cat([k for k, _ in parts], dim=2)[:, :, :n]  # [layers, H, n, D]
                values = torch.cat([v for _, v in parts], dim=2)[:, :, :n]  # [layers, H, n, Dv]
                cache.append_positions(slot, keys, values)
            lengths.append(cache.lengths[slot])
        return lengths

    def store(
        self,
        slot: int,
        tokens: Sequence[int],
        hit: Hit,
        final: torch.Tensor | None,  # [L - hit.length, H] hidden states of the computed prompt rows
        aux: torch.Tensor | None,  # [L - hit.length, n, H]
        salt: str | None = None,
    ) -> int:
        """Store the whole blocks of a prefilled prompt ``tokens`` that ``hit`` did not come from, reading
        slot ``slot`` of every cache; return how many were stored. A block is stored only when the
        target's cache holds it (and the hidden states when they are needed)."""
        if self.needs_hidden and final is None and aux is None:
            return 0
        bs, stored = self.block_size, 0
        count = min(len(tokens), self.caches[0].lengths[slot]) // bs
        parent: int | str = hit.entries[-1].id if hit.entries else (-1 if salt is None else salt)
        chain = list(hit.entries)
        for b in range(len(hit.entries), count):
            key = (parent, tuple(tokens[b * bs : (b + 1) * bs]))
            entry = self._by_key.get(key)
            if entry is None:
                entry = self._new_entry(slot, key, b, hit.length, final, aux, {e.id for e in chain})
                if entry is None:
                    break
                stored += 1
            chain.append(entry)
            parent = entry.id
        self._touch(chain)
        return stored

    def _touch(self, chain: Sequence[Entry]) -> None:
        """Make ``chain``'s stored entries the most recently used, parents after their children (so
        leaves are evicted first)."""
        for entry in reversed(chain):
            if entry.id in self._entries:
                self._entries.move_to_end(entry.id)

    def _new_entry(
        self,
        slot: int,
        key: BlockKey,
        block: int,
        first_row: int,
        final: torch.Tensor | None,
        aux: torch.Tensor | None,
        protect: set[int],
    ) -> Entry | None:
        """A new entry for block ``block`` of the prompt in slot ``slot``; ``None`` when it cannot be
        stored. Room is made by evicting entries outside ``protect`` (the prompt's own chain)."""
        bs = self.block_size
        start, end = block * bs, (block + 1) * bs
        kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [
            cache.read_positions(slot, start, end) if cache.lengths[slot] >= end else None
            for cache in self.caches
        ]
        rows = slice(start - first_row, end - first_row)
        h_final = final[rows].clone() if final is not None else None  # [bs, H]
        h_aux = aux[rows].clone() if aux is not None else None  # [bs, n, H]
        nbytes = _nbytes(h_final, h_aux) + sum(_nbytes(*p) for p in kv if p is not None)
        if nbytes > self.max_bytes:
            return None
        while self.nbytes + nbytes > self.max_bytes:  # the oldest entry off this prompt's chain goes
            victim = next((e for e in self._entries.values() if e.id not in protect), None)
            if victim is None:
                return None  # the chain fills the budget: its later blocks are not stored
            self._evict(victim)
        first = not isinstance(key[0], int) or key[0] == -1
        parent = None if first else self._entries.get(int(key[0]))
        if not first and parent is None:  # evicted between the lookup and now
            return None
        entry = Entry(self._next_id, key, kv, h_final, h_aux, nbytes)
        self._next_id += 1
        self._entries[entry.id] = entry
        self._by_key[key] = entry
        self.nbytes += nbytes
        if parent is not None:
            parent.children.add(entry.id)
        return entry

    def _evict(self, entry: Entry) -> None:
        """Drop ``entry`` and the blocks stored after it."""
        parent = self._entries.get(entry.key[0]) if isinstance(entry.key[0], int) else None
        if parent is not None:
            parent.children.discard(entry.id)
        doomed = [entry]
        while doomed:
            gone = doomed.pop()
            doomed += [self._entries[c] for c in gone.children if c in self._entries]
            self._entries.pop(gone.id, None)
            self._by_key.pop(gone.key, None)
            self.nbytes -= gone.nbytes


__all__ = ["NO_HIT", "Entry", "Hit", "PrefixCache"]
