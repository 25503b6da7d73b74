"""The cpu backend's attention: the reference's SDPA, or rows computed independently of the batch.

A model whose linear layers round their activations (packed int4 layers with int8 or bfloat16
activations) amplifies the last-bit differences SDPA makes between a row computed in a batch of K+1
and the same row decoded alone, and speculative greedy output then drifts from plain greedy output.
``prepare`` marks such a model (``batch_invariant``): its attention then computes every row over
exactly the keys it sees in one fixed order (``native_attention_rows``, our kernel in
``csrc/attention_rows.cpp``; ``_batch_invariant`` in torch where the kernel cannot run; a token-tree
step's rows each over the keys of its node's path, ``_tree_rows``). Every other
model gets ``sdpa_ragged_attention``, the reference's function, unchanged. The mark is kept here, in a
weak set of the model's modules, not on the model's config.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F

from spec_backend.backends.attention import (
    grouped_kv,
    layer_attention,
    ragged_metadata,
    sdpa_ragged_attention,
)
from spec_backend.cpu.native import native_op
from spec_backend.step import RaggedAttentionMetadata

#: modules of the models whose attention rows must not depend on the batch (module docstring)
_INVARIANT: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def mark_batch_invariant(model: torch.nn.Module) -> None:
    """Compute every attention row of ``model`` independently of the rest of the batch."""
    for module in model.modules():
        _INVARIANT.add(module)


def is_batch_invariant(module: torch.nn.Module) -> bool:
    """Whether ``module`` (a model or one of its attention modules) was marked by ``mark_batch_invariant``."""
    return module in _INVARIANT


def cpu_ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``[B, Q, Hq, D]``: batch-invariant rows for a marked model (a token-tree step's rows each over the
    keys its path sees, ``_tree_rows``), else the reference's SDPA (which also takes a marked model's
    layers with sinks or a soft cap). A sliding window reaches both paths."""
    layer, meta = layer_attention(kwargs), ragged_metadata(kwargs, module)
    if not is_batch_invariant(module) or layer.explicit:
        return sdpa_ragged_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    if meta.tree is not None:
        return _tree_rows(query, key, value, meta, scaling, layer.window), None
    rows = native_attention_rows(query, key, value, meta, scaling) if layer.window is None else None
    if rows is not None:
        return rows, None
    key, value, gqa = grouped_kv(query, key, value)
    return _batch_invariant(query, key, value, meta, scaling, gqa, layer.window), None


def native_attention_rows(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,
    meta: RaggedAttentionMetadata,
    scaling: float | None,
) -> torch.Tensor | None:  # [B, Q, Hq, D]
    """Batch-invariant attention by our native kernel (``csrc/attention_rows.cpp``): every row, prefill
    rows included, over exactly the keys it sees in one fixed order, so a row's output never depends on
    the other rows of the call (torch's SDPA gives a prompt row different last bits when the prompt is
    one token longer). ``None`` where the kernel is unavailable or the tensors are not float32 with a
    head dim that is a multiple of 16 up to 256; ``_batch_invariant`` runs then."""
    op = native_op("attention_rows")
    head_dim = query.shape[-1]
    if op is None or query.dtype != torch.float32 or key.dtype != torch.float32:
        return None
    if value.shape[-1] != head_dim:
        return None
    if head_dim % 16 or head_dim > 256:
        return None
    scale = scaling if scaling is not None else head_dim**-0.5
    # the kernel reads rows of D contiguous values; a projection may hand a transposed product on (the
    # tall-skinny float one does), which a copy makes readable without changing a value. Key and value
    # (the cache's views) are copied only when one of them needs it, and then both, to keep one layout.
    if query.stride(-1) != 1:
        query = query.contiguous()
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        key, value = key.contiguous(), value.contiguous()
    return op(query, key, value, meta.query_lens, meta.kv_lens, scale)


#: Up to this many query rows a request's rows are computed one by one (decode and verify steps).
ROW_BY_ROW = 16


def _batch_invariant(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,
    meta: RaggedAttentionMetadata,
    scaling: float | None,
    gqa: dict[str, Any],
    window: int | None = None,
) -> torch.Tensor:  # [B, Q, Hq, D]
    """Attention whose every row is computed the same way whatever else the step holds: each request on
    exactly its own keys (no padding), and in a decode or verify step each query row alone over the keys
    it sees. A token verified among K+1 drafts then gets bit for bit the hidden state it gets when
    decoded alone, which models with rounding steps inside (bfloat16 activations of packed int4 layers)
    need for speculative greedy output to equal plain greedy output. Costs one small SDPA call per row.
    The fallback where ``native_attention_rows`` is unavailable, and the path of sliding-window layers
    (a row then sees only the last ``window`` positions up to its own)."""
    out = query.new_zeros((*query.shape[:3], value.shape[-1]))  # [B, Hq, Q, Dv]; padding rows stay 0
    q_lens, kv_lens = meta.query_lens.tolist(), meta.kv_lens.tolist()
    for b, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens, strict=True)):
        k, v, first = key[b : b + 1, :, :kv_len], value[b : b + 1, :, :kv_len], kv_len - q_len
        if q_len > ROW_BY_ROW:  # a prefill; SDPA's last bits here depend on the prompt's length
            k_pos = torch.arange(kv_len, device=query.device)[None]  # [1, L]
            q_pos = (first + torch.arange(q_len, device=query.device))[:, None]  # [Q, 1]
            mask = (k_pos <= q_pos) & (k_pos > q_pos - (window or kv_len + 1))
            out[b, :, :q_len] = F.scaled_dot_product_attention(
                query[b : b + 1, :, :q_len], k, v, attn_mask=mask, scale=scaling, **gqa
            )[0]
            continue
        for i in range(q_len):  # row i sees positions start .. first + i (start 0 without a window)
            start = max(0, first + i + 1 - window) if window is not None else 0
            out[b, :, i] = F.scaled_dot_product_attention(
                query[b : b + 1, :, i : i + 1],
                k[:, :, start : first + i + 1],
                v[:, :, start : first + i + 1],
                scale=scaling,
                **gqa,
            )[0, :, 0]
    return out.transpose(1, 2).contiguous()


def _tree_rows(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,
    meta: RaggedAttentionMetadata,
    scaling: float | None,
    window: int | None,
) -> torch.Tensor:  # [B, Q, Hq, D]
    """A token-tree step of a marked model: each row alone over exactly the keys a plain decode of its
    node's path sees, in position order — the cached prefix, the root, its ancestors and itself (within
    the window, by depth) — so a node gets bit for bit the row it gets when its path is decoded."""
    assert meta.tree is not None and meta.tree_depths is not None
    out = query.new_zeros((*query.shape[:3], value.shape[-1]))  # [B, Hq, Q, Dv]; padding rows stay 0
    q_lens, kv_lens = meta.query_lens.tolist(), meta.kv_lens.tolist()
    for b, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens, strict=True)):
        first, depth = kv_len - q_len, meta.tree_depths[b, :q_len].tolist()
        for i in range(q_len):
            low = first + depth[i] + 1 - window if window is not None else 0  # the first position seen
            seen = [
                c
                for c in torch.nonzero(meta.tree[b, i, :q_len]).flatten().tolist()
                if first + depth[c] >= low
            ]
            index = torch.tensor(
                [*range(max(0, low), first), *(first + c for c in seen)], device=query.device
            )
            q, k, v = query[b : b + 1, :, i : i + 1], key[b : b + 1, :, index], value[b : b + 1, :, index]
            out[b, :, i] = _one_row(q, k, v, scaling, kernel=window is None)
    return out.transpose(1, 2).contiguous()


def _one_row(
    query: torch.Tensor,  # [1, Hq, 1, D]
    key: torch.Tensor,  # [1, Hkv, L, D] exactly the keys the row sees
    value: torch.Tensor,
    scaling: float | None,
    kernel: bool,
) -> torch.Tensor:  # [Hq, Dv]
    """One row over all of ``key``, as a decode step computes it: the row kernel where it runs (``kernel``:
    not a windowed layer, which decodes through ``_batch_invariant``'s SDPA), else SDPA."""
    lengths = RaggedAttentionMetadata(torch.tensor([1]), torch.tensor([key.shape[2]]))
    rows = native_attention_rows(query, key, value, lengths, scaling) if kernel else None  # [1, 1, Hq, Dv]
    if rows is not None:
        return rows[0, 0]
    key, value, gqa = grouped_kv(query, key, value)
    return F.scaled_dot_product_attention(query, key, value, scale=scaling, **gqa)[0, :, 0]


__all__ = ["cpu_ragged_attention", "is_batch_invariant", "mark_batch_invariant", "native_attention_rows"]
