"""Batched n-gram proposer as tensor ops on any torch device (identical results to ``ngram``).

Histories live on the device in one padded buffer ``tokens [slots, capacity]`` with host-side lengths.
Step updates are queued on the host and written with one scatter per :meth:`NgramGpuProposer.propose`;
one proposal is a fixed sequence of batched ops over ``[B, L]``. In the engine the drafts stay on the
device (``propose_on_device``: the step verifies each request's budget of draft rows, placeholders past
its match); ``propose`` (the host interface) makes one device-to-host copy of drafts and counts.

*Ahead* (``propose_ahead``, async speculative steps: ``engine/spec_ahead.py``): a step's emitted tokens,
still on the device and not read by the host, are written after each history first and the drafts found
over them; when the host later lands that step, ``update`` with the same tokens only counts them (they are
written already: ``_ahead`` holds, per slot, the steps written ahead and not landed).

Matching aligns candidate n-grams by their END position ``e``: ``eq_j[b, e] = tokens[b, e-j] ==
tokens[b, len_b-1-j]``; the n-gram ending at ``e`` matches the length-n suffix iff ``eq_0 & ... &
eq_{n-1}``, so all n share one running AND (a cumulative product over ``j``: one batch of ops for every
n). A match is usable when ``n-1 <= e <= len_b-2`` (it has a next token); the latest usable ``e`` of the
largest matching ``n`` in ``[prompt_lookup_min, prompt_lookup_max]`` wins and the draft is
``tokens[b, e+1 : e+1+k]`` clipped at ``len_b``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from spec_backend.config.ngram import resolve_lookup_window
from spec_backend.proposers.base import Proposer, draft_limits, speculative_tokens

if TYPE_CHECKING:
    from spec_backend.config import SpeculativeConfig

__all__ = ["NgramGpuProposer", "build_ngram_gpu_proposer"]


class NgramGpuProposer(Proposer):
    """Prompt-lookup drafting as batched tensor ops on ``device`` (CPU works too)."""

    def __init__(
        self,
        num_speculative_tokens: int,
        prompt_lookup_min: int,
        prompt_lookup_max: int,
        device: torch.device | str | None = None,
    ) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens={num_speculative_tokens} must be >= 1")
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(
                f"need 1 <= prompt_lookup_min={prompt_lookup_min} <= prompt_lookup_max={prompt_lookup_max}"
            )
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._tokens = torch.zeros((0, 256), dtype=torch.int32, device=self.device)  # [slots, capacity]
        self._slot: dict[str, int] = {}
        self._free: list[int] = []
        self._length: list[int] = []  # per slot, including queued tokens
        self._pending: dict[int, tuple[int, list[int]]] = {}  # slot -> (first position, queued tokens)
        self._ahead: dict[int, int] = {}  # slot -> steps whose tokens ``propose_ahead`` wrote, not landed
        #: [slots] int64: each history's length on the device (the tokens written there), so that drafting
        #: ahead copies nothing from the host (a copy from pageable memory waits for the device's queue)
        self._device_lengths = torch.zeros(0, dtype=torch.int64, device=self.device)
        self._index_cache: dict[tuple[int, ...], torch.Tensor] = {}  # slots or limits -> a device tensor

    # ----------------------------------------------------------------------------------------- state
    def add_request(self, req_id: str, prompt_token_ids: Sequence[int]) -> None:
        """Copy the prompt into a free row (one host-to-device copy)."""
        self.remove_request(req_id)
        prompt = torch.as_tensor(list(prompt_token_ids), dtype=torch.int32).reshape(-1)  # [P]
        slot = self._free.pop() if self._free else self._new_slot()
        self._ensure_capacity(prompt.shape[0])
        self._tokens[slot, : prompt.shape[0]] = prompt.to(self.device)
        self._length[slot] = int(prompt.shape[0])
        self._device_lengths[slot] = int(prompt.shape[0])
        self._slot[req_id] = slot

    def update(self, req_id: str, new_token_ids: Sequence[int]) -> None:
        """Queue the tokens on the host; they reach the device with the next proposal's scatter."""
        if not new_token_ids:
            return
        slot = self._slot[req_id]
        if self._ahead.get(slot, 0):  # ``propose_ahead`` wrote these on the device: count them only
            self._ahead[slot] -= 1
            self._length[slot] += len(new_token_ids)
            return
        _, queued = self._pending.setdefault(slot, (self._length[slot], []))
        queued.extend(int(t) for t in new_token_ids)
        self._length[slot] += len(new_token_ids)

    def remove_request(self, req_id: str) -> None:
        slot = self._slot.pop(req_id, None)
        if slot is not None:
            self._pending.pop(slot, None)
            self._ahead.pop(slot, None)
            self._length[slot] = 0
            self._free.append(slot)

    @property
    def memory_bytes(self) -> int:
        """Bytes of the device token buffer."""
        return int(self._tokens.numel() * self._tokens.element_size())

    def _new_slot(self) -> int:
        slot = self._tokens.shape[0]
        grow = max(8, slot)  # double the rows
        extra = torch.zeros((grow, self._tokens.shape[1]), dtype=torch.int32, device=self.device)
        self._tokens = torch.cat([self._tokens, extra], dim=0)
        self._device_lengths = torch.cat([self._device_lengths, self._device_lengths.new_zeros(grow)])
        self._length.extend([0] * grow)
        self._free.extend(range(slot + grow - 1, slot, -1))
        return slot

    def _ensure_capacity(self, needed: int) -> None:
        cap = self._tokens.shape[1]
        if needed <= cap:
            return
        while cap < needed:
            cap *= 2
        grown = torch.zeros((self._tokens.shape[0], cap), dtype=torch.int32, device=self.device)
        grown[:, : self._tokens.shape[1]] = self._tokens
        self._tokens = grown

    def _flush(self) -> None:
        """Write all queued tokens with one scatter."""
        if not self._pending:
            return
        self._ensure_capacity(max(self._length))
        rows: list[int] = []
        cols: list[int] = []
        vals: list[int] = []
        slots = list(self._pending)
        for slot, (start, queued) in self._pending.items():
            rows.extend([slot] * len(queued))
            cols.extend(range(start, start + len(queued)))
            vals.extend(queued)
        self._pending.clear()
        lengths = torch.tensor([[s, self._length[s]] for s in slots], dtype=torch.long).to(self.device)
        self._device_lengths[lengths[:, 0]] = lengths[:, 1]  # [S]: the histories as written now
        index = torch.tensor([rows, cols], dtype=torch.long).to(self.device)  # [2, T]
        values = torch.tensor(vals, dtype=torch.int32).to(self.device)  # [T]
        self._tokens.index_put_((index[0], index[1]), values)

    # ---------------------------------------------------------------------------------------- propose
    def propose(self, req_ids: Sequence[str], max_tokens: Sequence[int] | None = None) -> list[list[int]]:
        limits = draft_limits(self.num_speculative_tokens, len(req_ids), max_tokens)
        if not req_ids:
            return []
        drafts, counts = self.propose_on_device(req_ids, limits)
        rows = torch.cat([drafts.to(torch.int64), counts[:, None]], dim=1).tolist()  # one copy: [B, K + 1]
        return [row[: row[-1]] for row in rows]

    def propose_on_device(
        self, req_ids: Sequence[str], max_tokens: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # drafts [B, K], counts [B]
        """The matches of ``req_ids`` as device tensors (module docstring), capped at ``max_tokens``."""
        limits = draft_limits(self.num_speculative_tokens, len(req_ids), max_tokens)
        self._flush()
        slots = [self._slot[r] for r in req_ids]
        lengths_host = [self._length[s] for s in slots]
        width = max(1, max(lengths_host))
        slot_t = torch.tensor(slots, dtype=torch.long).to(self.device)  # [B]
        lens = torch.tensor(lengths_host, dtype=torch.long).to(self.device)  # [B]
        lim = torch.tensor(limits, dtype=torch.long).to(self.device)  # [B]
        tokens = self._tokens.index_select(0, slot_t)[:, :width]  # [B, L]
        return ngram_match(
            tokens, lens, lim, self.prompt_lookup_min, self.prompt_lookup_max, self.num_speculative_tokens
        )

    def propose_ahead(
        self,
        req_ids: Sequence[str],
        emitted: torch.Tensor,  # [B, W] int64 on the device: a step's emitted tokens, padding after them
        counts: torch.Tensor,  # [B] int64 on the device: each request's emitted tokens (1 .. W)
        max_tokens: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:  # drafts [B, K], counts [B]
        """Each request's ``counts[b]`` tokens of ``emitted`` appended on the device (a step not landed on
        the host), then the matches over the histories with them (module docstring). The next ``update``
        of each request must bring exactly those tokens (the step, landed)."""
        limits = draft_limits(self.num_speculative_tokens, len(req_ids), max_tokens)
        self._flush()  # nothing queued while steps go ahead: ``update`` only counts their tokens
        slots = [self._slot[r] for r in req_ids]
        width = max((self._length[s] for s in slots), default=0) + emitted.shape[1]  # the landed tokens
        self._ensure_capacity(width)
        slot_t, lim = self._on_device(slots), self._on_device(limits, len(slots))  # [B], [B]
        lens = self._device_lengths[slot_t]  # [B]
        cols = lens[:, None] + torch.arange(emitted.shape[1], device=self.device)  # [B, W]
        # past each count: padding beyond the history's length, never matched, overwritten by what follows
        self._tokens[slot_t[:, None].expand_as(cols), cols] = emitted.to(torch.int32)
        self._device_lengths[slot_t] = lens + counts
        for slot in slots:
            self._ahead[slot] = self._ahead.get(slot, 0) + 1
        tokens = self._tokens.index_select(0, slot_t)[:, :width]  # [B, L]
        return ngram_match(
            tokens, lens + counts, lim, self.prompt_lookup_min, self.prompt_lookup_max,
            self.num_speculative_tokens,
        )  # fmt: skip

    def _on_device(self, values: Sequence[int], tag: int = -1) -> torch.Tensor:  # [len(values)] int64
        """``values`` as a device tensor, copied once and kept (a batch's slots and limits repeat from
        step to step); ``tag`` keeps lists of different meanings apart."""
        key = (tag, *values)
        found = self._index_cache.get(key)
        if found is None:
            if len(self._index_cache) >= 256:
                self._index_cache.clear()
            found = self._index_cache[key] = torch.tensor(list(values), dtype=torch.long).to(self.device)
        return found


#: the most elements of a ``[B, J, L]`` comparison ``ngram_match`` makes at once (~18 bytes each): longer
#: windows and histories are matched a few n-gram lengths at a time, the running AND carried over
MATCH_CHUNK_ELEMENTS = 1 << 20


def ngram_match(
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    limits: torch.Tensor,
    n_min: int,
    n_max: int,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched prompt lookup, n-gram lengths matched together (on a GPU each op is a launch the host
    pays for), in chunks of lengths that keep a comparison within ``MATCH_CHUNK_ELEMENTS``.

    Args:
        tokens: [B, L] int, row b valid in ``[0, lengths[b])`` (padding is ignored).
        lengths: [B] long. limits: [B] long, per-request draft cap (<= k).
    Returns:
        drafts [B, k] (same dtype as tokens; entries past ``counts[b]`` are padding) and counts [B] long.
    """
    batch, width = tokens.shape
    device = tokens.device
    pos = torch.arange(width, device=device)  # [L]
    has_next = (pos <= (lengths - 2)[:, None])[:, None, :]  # [B, 1, L]: an end with a next token
    lengths_n = min(n_max, width)  # an n-gram longer than the row cannot match
    chunk = max(1, MATCH_CHUNK_ELEMENTS // max(1, batch * width))
    carry: torch.Tensor | None = None  # [B, 1, L]: the last chunk's longest running match
    latest_all = []
    for j0 in range(0, lengths_n, chunk):
        j = torch.arange(j0, min(lengths_n, j0 + chunk), device=device)  # [J]
        suffix = tokens.gather(1, (lengths[:, None] - 1 - j).clamp(min=0))  # [B, J]: tokens[b, len_b-1-j]
        back = pos - j[:, None]  # [J, L]: e - j
        eq = (tokens[:, back.clamp(min=0)] == suffix[:, :, None]) & (back >= 0)  # [B, J, L]
        # [B, J, L]: the n-gram of length j+1 ending at e matches the suffix (every shorter one does too)
        running = eq.to(torch.uint8).cumprod(dim=1).bool()
        running = running if carry is None else running & carry
        carry = running[:, -1:]
        latest_all.append(torch.where(running & has_next, pos, -1).amax(dim=2))  # [B, J]: latest end
    latest = torch.cat(latest_all, dim=1)  # [B, n_max']
    j = torch.arange(lengths_n, device=device)  # [J]
    longest = torch.where((j + 1 >= n_min) & (latest >= 0), j, -1)  # [B, J]: the largest matching n wins
    best_end = torch.where(
        longest.amax(dim=1) >= 0, latest.gather(1, longest.argmax(dim=1, keepdim=True)).squeeze(1), -1
    )  # [B]
    found = best_end >= 0  # [B]
    start = best_end + 1  # [B]
    counts = torch.where(found, torch.minimum(limits, lengths - start), 0).clamp(min=0)  # [B]
    gather_idx = (start.unsqueeze(1) + torch.arange(k, device=device)).clamp(0, width - 1)  # [B, k]
    drafts = tokens.gather(1, gather_idx)  # [B, k]
    return drafts, counts


def build_ngram_gpu_proposer(
    config: SpeculativeConfig, device: torch.device | None = None
) -> NgramGpuProposer:
    """The ``ngram_gpu`` method's proposer from a validated config, running on ``device``."""
    lo, hi = resolve_lookup_window("ngram_gpu", config.prompt_lookup_min, config.prompt_lookup_max)
    return NgramGpuProposer(speculative_tokens(config), lo, hi, device=device)
