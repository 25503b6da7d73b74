"""``StepBatch``: the one batch descriptor of an engine step, built once and read by every stage.

The engine builds it from its slot table; the KV cache, the attention function, the rejection sampler
and the drafter all read views of it, so nothing re-derives per-token indices from Python lists.

Glossary:

* *slot* — the row of the KV caches a request occupies for its whole life (live slots are packed at
  ``0 .. n-1``; one step covers the contiguous range ``start .. start+B-1``);
* *query tokens* — the tokens fed to the target this step: a prefill feeds the prompt, a decode step
  feeds ``[last token] + drafts``; ``N`` of them in the whole batch, ``Q`` at most per request;
* *padded layout* — the ``[B, Q]`` grid transformers models take; ``rows``/``cols`` map each of the
  ``N`` valid tokens into it (request-major, the order of every flat ``[N]`` tensor here);
* *seq len* — cached positions of a request after this step's keys are written.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata


@dataclass(frozen=True)
class RaggedAttentionMetadata:
    """Per-request lengths, passed to the model's forward as ``spec_attn_metadata=...``.

    One object describes one step. Code that rewrites ``query_lens`` / ``kv_lens`` in place and reuses
    the object (static graph buffers) must call ``invalidate()`` unless the tensors track versions
    (inference-mode tensors do not).
    """

    query_lens: torch.Tensor  # [B] int64, new tokens per request this step
    kv_lens: torch.Tensor  # [B] int64, valid cached tokens per request after this step
    #: masks already built for this step, keyed by shape, the length tensors' versions and the window
    mask_cache: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict, compare=False, repr=False)
    #: per window-bounded layer index, the lengths its keys are seen with (``runtime.window_cache``)
    windowed: dict[int, RaggedAttentionMetadata] = field(default_factory=dict, compare=False, repr=False)
    #: set on those lengths: the ring view shows ``margin`` positions before each request's step, so its
    #: kv length is ``min(kv_len, query_len + margin)`` (what a captured graph re-issued with host
    #: lengths needs)
    ring_margin: int | None = None
    #: a token-tree step (``build_tree_step_batch``): query ``i`` sees this step's key ``j`` only where
    #: ``tree[b, i, j]`` (``j`` is ``i`` or one of its ancestors), and the depth of each query below the
    #: request's first query token places it (``first + depth``) for RoPE and sliding windows
    tree: torch.Tensor | None = field(default=None, compare=False, repr=False)  # [B, Q, Q] bool
    tree_depths: torch.Tensor | None = field(default=None, compare=False, repr=False)  # [B, Q] int64

    def invalidate(self) -> None:
        """Forget masks built for earlier values of the length tensors."""
        self.mask_cache.clear()
        self.windowed.clear()

    def for_layer(self, module: Any) -> RaggedAttentionMetadata:
        """The lengths attention module ``module`` sees its keys with: a window-bounded layer's keys start
        at a later position than 0 (``runtime.window_cache``); every other layer's, this object."""
        return self.windowed.get(getattr(module, "layer_idx", -1), self)


@dataclass(frozen=True)
class StepBatch:
    """One forward's batch (see the module docstring). Device tensors unless noted."""

    start: int  # host: first slot of the batch
    slot_ids: torch.Tensor  # [B] int64
    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64 absolute positions (= cache positions)
    query_start_loc: torch.Tensor  # [B+1] int64
    query_lens: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64, cached positions after this step
    rows: torch.Tensor  # [N] int64, batch row of each token in the padded layout
    cols: torch.Tensor  # [N] int64, query column of each token in the padded layout
    query_lens_host: tuple[int, ...]  # host: [B]
    num_draft_tokens: tuple[int, ...]  # host: [B] drafts fed after each request's first token
    max_seq_len: int  # host: longest seq len (the width of the cache views attention reads)
    draft_token_ids: torch.Tensor  # [T] int32, the drafts in request order (T = sum of num_draft_tokens)
    attention: RaggedAttentionMetadata  # view: (query_lens, seq_lens)
    #: captured layout: cache views span the whole capacity, nothing derives shapes from host lengths
    static_shapes: bool = False
    #: a token-tree step: each query token's position for RoPE (``first + depth``; ``positions`` stay the
    #: cache positions ``first + column``)
    rope_positions: torch.Tensor | None = None  # [N] int64

    @property
    def batch_size(self) -> int:
        return len(self.query_lens_host)

    @property
    def num_tokens(self) -> int:
        """N: valid query tokens."""
        return int(self.input_ids.shape[0])

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_host)

    @property
    def unpadded(self) -> bool:
        """Every request feeds ``Q`` query tokens: the padded layout is the flat order, row by row."""
        return min(self.query_lens_host) == self.max_query_len

    @property
    def query_start_loc_host(self) -> list[int]:
        """``query_start_loc`` on the host, from ``query_lens_host`` (no device read): ``[B+1]``."""
        return list(itertools.accumulate(self.query_lens_host, initial=0))

    @property
    def last_token_index(self) -> torch.Tensor:
        """``[B]`` flat index of each request's last query token."""
        return self.query_start_loc[1:] - 1

    def padded(self, flat: torch.Tensor, fill: int | float = 0) -> torch.Tensor:
        """Scatter a flat ``[N, ...]`` tensor into the ``[B, Q, ...]`` padded layout (without padding: a
        view of ``flat``)."""
        if self.unpadded:
            return flat.view(self.batch_size, self.max_query_len, *flat.shape[1:])
        out = flat.new_full((self.batch_size, self.max_query_len, *flat.shape[1:]), fill)
        out[self.rows, self.cols] = flat
        return out

    def padded_positions(self) -> torch.Tensor:
        """``[B, Q]`` position ids; padding columns repeat the request's last valid position (a tree step:
        its first position)."""
        if self.rope_positions is None and self.unpadded:
            return self.positions.view(self.batch_size, self.max_query_len)  # no padding: [B, Q]
        q_idx = torch.arange(self.max_query_len, device=self.positions.device)  # [Q]
        first = self.seq_lens - self.query_lens  # [B]
        if self.rope_positions is not None:
            out = first[:, None].expand(-1, self.max_query_len).clone()  # [B, Q]
            out[self.rows, self.cols] = self.rope_positions
            return out
        return first[:, None] + torch.minimum(q_idx[None, :], (self.query_lens - 1)[:, None])

    def spec_decode_metadata(self, last_only: bool = False) -> SpecDecodeMetadata:
        """The sampler's metadata as a view: every query row has logits (K target rows + bonus row), or
        with ``last_only`` (a prefill) one bonus row per request and no drafts."""
        nums = list(self.num_draft_tokens)
        if last_only and any(nums):
            raise ValueError(f"last_only logits cannot verify drafts, got num_draft_tokens={nums}")
        return _verify_layout(nums, self.draft_token_ids)  # last_only: row b is request b's (no drafts)


def _verify_layout(nums: list[int], draft_token_ids: torch.Tensor) -> SpecDecodeMetadata:
    """Every query row has logits: request ``b``'s ``nums[b]`` target rows, then its bonus row. The
    indices follow from the host counts alone, so they are built as one host tensor and copied once (the
    per-draft request and slot indices likewise, in ``SpecDecodeMetadata``), instead of derived on the
    device op by op (some fifteen small ops a step). A step without drafts (plain decoding) reuses its
    batch size's layout (``_plain_layout``)."""
    batch, total = len(nums), sum(nums)
    if not total:  # no draft ids to carry: the batch's are empty, as the cached layout's
        return _plain_layout(batch, draft_token_ids.device)
    bounds = list(itertools.accumulate(nums))  # [B] inclusive cumulative drafts
    bonus = [k + b for b, k in enumerate(bounds)]  # [B] row of each bonus logit
    target = [t + b for b, (k, end) in enumerate(zip(nums, bounds, strict=True)) for t in range(end - k, end)]
    device = draft_token_ids.device
    small = torch.tensor(bounds + target + bonus + list(range(total + batch)), dtype=torch.int32)
    sizes = [batch, total, batch, total + batch]
    cu, target_rows, bonus_rows, logits_rows = torch.split(small.to(device), sizes)
    return SpecDecodeMetadata(
        draft_token_ids=draft_token_ids,
        num_draft_tokens=nums,
        cu_num_draft_tokens=cu,
        target_logits_indices=target_rows,
        bonus_logits_indices=bonus_rows,
        logits_indices=logits_rows,
        standard_layout=True,
    )


def build_step_batch(
    start: int,
    tokens: torch.Tensor,  # [B, Q] int64 padded query tokens (device)
    query_lens: Sequence[int],  # host [B]
    cache_lens: Sequence[int],  # host [B] cached positions before this step
    num_draft_tokens: Sequence[int] | None = None,
) -> StepBatch:
    """Build the step's descriptor from the slot table's host counts and the padded query tokens.

    ``num_draft_tokens`` defaults to none (a prefill); in a decode step request ``b`` feeds its last
    token then ``query_lens[b] - 1`` drafts.
    """
    batch = len(query_lens)
    if batch == 0 or tokens.shape[0] != batch or min(query_lens) < 1 or max(query_lens) > tokens.shape[1]:
        raise ValueError(
            f"a step needs >= 1 request with >= 1 query token each, got query_lens={list(query_lens)} "
            f"for tokens of shape {list(tokens.shape)}"
        )
    lens, cached_host = [int(q) for q in query_lens], [int(c) for c in cache_lens]
    rows_host = [b for b, q in enumerate(lens) for _ in range(q)]
    cols_host = [i for q in lens for i in range(q)]
    # every host-derived index in one tensor: one copy to the device, then views of it
    sections = [
        lens,
        [c + q for c, q in zip(cached_host, lens, strict=True)],
        list(itertools.accumulate(lens, initial=0)),
        rows_host,
        cols_host,
        [cached_host[b] + i for b, i in zip(rows_host, cols_host, strict=True)],
        list(range(start, start + batch)),
    ]
    device, flat_host = tokens.device, [v for section in sections for v in section]
    packed = torch.tensor(flat_host, dtype=torch.int64).to(device)
    # [B], [B], [B+1], then [N] each, then [B]
    q_lens, seq_lens, loc, rows, cols, positions, slot_ids = torch.split(packed, [len(x) for x in sections])
    drafts = tuple(num_draft_tokens) if num_draft_tokens is not None else (0,) * batch
    if any(d != q - 1 for d, q in zip(drafts, query_lens, strict=True)) and any(drafts):
        raise ValueError(f"num_draft_tokens {list(drafts)} must be query_lens - 1 {list(query_lens)}")
    full = min(lens) == tokens.shape[1]  # no padding: the flat order is the grid's row-major order
    flat = tokens.reshape(-1) if full else tokens[rows, cols]  # [N] query tokens in request order
    if not any(drafts):
        draft_ids = tokens.new_zeros(0, dtype=torch.int32)
    else:  # [T] every column after the first, request-major
        draft_ids = (tokens[:, 1:].reshape(-1) if full else flat[cols >= 1]).to(torch.int32)
    return StepBatch(
        start=start,
        slot_ids=slot_ids,
        input_ids=flat.clamp_min(0),  # placeholder drafts (-1) are fed as token 0
        positions=positions,
        query_start_loc=loc,
        query_lens=q_lens,
        seq_lens=seq_lens,
        rows=rows,
        cols=cols,
        query_lens_host=tuple(lens),
        num_draft_tokens=drafts,
        max_seq_len=max(sections[1]),
        draft_token_ids=draft_ids,
        attention=RaggedAttentionMetadata(query_lens=q_lens, kv_lens=seq_lens),
    )


def build_tree_step_batch(
    start: int,
    tokens: torch.Tensor,  # [B, Q] int64: each request's last committed token, then its tree's tokens
    parents: Sequence[Sequence[int]],  # host [B][n_b]: node i's parent (-1: the first query token)
    cache_lens: Sequence[int],  # host [B] cached positions before this step
) -> StepBatch:
    """A verify step over one token tree per request: column 0 is the last committed token, column
    ``1 + i`` tree node ``i`` (``build_tree_batch`` with the committed token as every tree's root)."""
    for nodes in parents:
        for i, parent in enumerate(nodes):
            if not -1 <= parent < i:
                raise ValueError(f"tree parents {list(nodes)}: node {i} needs a parent in -1..{i - 1}")
    return build_tree_batch(start, tokens, [[-1, *(p + 1 for p in nodes)] for nodes in parents], cache_lens)


def build_tree_batch(
    start: int,
    tokens: torch.Tensor,  # [B, Q] int64: each request's query tokens, parents before children
    parents: Sequence[Sequence[int]],  # host [B][q_b]: column i's parent column (-1: none, depth 0)
    cache_lens: Sequence[int],  # host [B] cached positions before this step
) -> StepBatch:
    """A forward over a forest of query columns per request. Keys land at the cache positions
    ``first + column``; each query is placed at ``first + depth`` and sees the cached prefix, itself and
    its ancestor columns only. A draft head's tree level (``proposers.eagle``) has several roots."""
    lens = [len(p) for p in parents]
    batch = build_step_batch(start, tokens, lens, cache_lens, [n - 1 for n in lens])
    q, host_depths, host_tree = batch.max_query_len, [], []
    for columns in parents:
        depth: list[int] = []  # per column: depth, and the columns it sees (ancestors and itself)
        above: list[list[int]] = []
        for i, parent in enumerate(columns):
            if not -1 <= parent < i:
                raise ValueError(f"tree parents {list(columns)}: column {i} needs a parent in -1..{i - 1}")
            depth.append(0 if parent < 0 else depth[parent] + 1)
            above.append([*(above[parent] if parent >= 0 else ()), i])
        host_depths += depth
        host_tree.append([[j in cols for j in range(q)] for cols in above] + [[False] * q] * (q - len(above)))
    device = tokens.device
    depths = torch.tensor(host_depths, dtype=torch.int64).to(device)  # [N]
    first = (batch.seq_lens - batch.query_lens)[batch.rows]  # [N]
    meta = RaggedAttentionMetadata(
        query_lens=batch.query_lens,
        kv_lens=batch.seq_lens,
        tree=torch.tensor(host_tree, dtype=torch.bool).to(device),  # [B, Q, Q]
        tree_depths=batch.padded(depths),  # [B, Q]
    )
    return replace(batch, attention=meta, rope_positions=first + depths)


@dataclass(frozen=True)
class HiddenStateRequest:
    """Which target hidden states a drafter needs from each forward (see the glossary)."""

    final: bool = False  # post-norm last hidden state [N, H]
    aux_layer_ids: tuple[int, ...] = ()  # residual streams [N, len(ids), H], in this order

    def __or__(self, other: HiddenStateRequest) -> HiddenStateRequest:
        ids = self.aux_layer_ids + tuple(i for i in other.aux_layer_ids if i not in self.aux_layer_ids)
        return HiddenStateRequest(self.final or other.final, ids)

    @property
    def any(self) -> bool:
        return self.final or bool(self.aux_layer_ids)


@dataclass(frozen=True)
class TargetOutput:
    """One target forward: logits of the rows the sampler reads, hidden states of every query row."""

    logits: torch.Tensor  # [R, V] float
    final: torch.Tensor | None = None  # [N, H] post-norm
    aux: torch.Tensor | None = None  # [N, n_aux, H]


class SlotCache(Protocol):
    """A per-slot cache a drafter owns; the engine's slot table moves and frees its slots."""

    def add_slot(self) -> int: ...

    def move_slot(self, src: int, dst: int) -> None: ...

    def pop_slot(self) -> None: ...

    def reset(self) -> None: ...

    @property
    def num_slots(self) -> int: ...


class StepPlanned(Protocol):
    """The cache a per-layer store belongs to, as that store sees it: the step being run (``None``
    between steps) and the cache's length bookkeeping (``runtime.kv_cache.RaggedKVCache``)."""

    plan: StepBatch | None
    max_len: int

    def get_seq_length(self, layer_idx: int = 0) -> int: ...

    def crop(self, tokens_to_remove: int) -> None: ...


@functools.lru_cache(maxsize=256)
def _plain_layout(batch: int, device: torch.device) -> SpecDecodeMetadata:
    """The layout of ``batch`` requests without drafts (each one's bonus row is row ``b``), built once per
    batch size and device: its tensors are only read (the sampler copies what it changes), and a plain
    step rebuilt it every step (two host tensors, two copies, the metadata's checks: ~0.1 ms of a CPU
    step)."""
    rows = torch.arange(batch, dtype=torch.int32).to(device)  # [B]
    none = rows[:0]  # [0]
    return SpecDecodeMetadata(
        draft_token_ids=none,
        num_draft_tokens=[0] * batch,
        cu_num_draft_tokens=torch.zeros(batch, dtype=torch.int32).to(device),
        target_logits_indices=none,
        bonus_logits_indices=rows,
        logits_indices=rows,
        standard_layout=True,
    )


def valid_drafts(tokens: torch.Tensor) -> torch.Tensor:  # [B] int64
    """Each request's drafts before its first placeholder, from the query tokens ``[B, 1 + K]`` (the
    last token, then the drafts)."""
    drafts = tokens[:, 1:] != PLACEHOLDER_TOKEN_ID  # [B, K]
    return torch.cumprod(drafts.to(torch.int64), dim=1).sum(dim=1)


def unpack_emitted(rows: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """A step's packed verification read back (per request its emitted tokens, placeholders after them,
    then its verified draft count; ``Verifier.launch``): the emitted tokens and the counts."""
    emitted = [[t for t in row[:-1] if t != PLACEHOLDER_TOKEN_ID] for row in rows]
    return emitted, [row[-1] for row in rows]


__all__ = [
    "HiddenStateRequest",
    "RaggedAttentionMetadata",
    "SlotCache",
    "StepBatch",
    "StepPlanned",
    "TargetOutput",
    "build_step_batch",
    "build_tree_batch",
    "build_tree_step_batch",
    "unpack_emitted",
    "valid_drafts",
]
