"""Reference ragged attention for transformers' ``AttentionInterface``.

The engine runs one batched forward in which request ``b`` carries ``query_lens[b]`` new tokens
(K+1 while verifying, padded up to the batch's longest) and its KV cache holds ``kv_lens[b]`` tokens
*including* the new ones. Query ``i`` of request ``b`` sits at absolute position
``kv_lens[b] - query_lens[b] + i`` and sees every key at a position ``<=`` its own (causal within the
request's new tokens, full over its cached prefix). Padding query rows always see key 0 (at least),
so their softmax stays finite; their outputs are ignored by the engine.

Glossary: *query tokens* — the tokens whose hidden states are computed this step; *kv length* — how
many cached positions of a request are valid after this step's keys were written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from spec_backend.backends.native import native_op

#: ``scaled_dot_product_attention(enable_gqa=...)`` exists from torch 2.5.
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass(frozen=True)
class RaggedAttentionMetadata:
    """Per-request lengths, passed to the model's forward as ``spec_attn_metadata=...``.

    One object describes one step. Code that rewrites ``query_lens`` / ``kv_lens`` in place and reuses
    the object (static graph buffers) must call ``invalidate()`` unless the tensors track versions
    (inference-mode tensors do not).
    """

    query_lens: torch.Tensor  # [B] int64, new tokens per request this step
    kv_lens: torch.Tensor  # [B] int64, valid cached tokens per request after this step
    #: masks already built for this step, keyed by shape and the length tensors' versions
    mask_cache: dict[tuple[int, int, int, int], torch.Tensor] = field(
        default_factory=dict, compare=False, repr=False
    )

    def invalidate(self) -> None:
        """Forget masks built for earlier values of the length tensors."""
        self.mask_cache.clear()


def _version(t: torch.Tensor) -> int:
    """In-place modification counter; inference-mode tensors have none (-1)."""
    return -1 if t.is_inference() else int(t._version)


def ragged_causal_mask(meta: RaggedAttentionMetadata, q_len: int, kv_len: int) -> torch.Tensor:
    """Boolean mask ``[B, 1, q_len, kv_len]``: True where a query may attend a key.

    Every decoder layer of one forward asks for the same mask: it is built once per step and reused.
    The key includes the version counters of ``query_lens`` / ``kv_lens`` where they exist, so a
    metadata object whose tensors are updated in place never gets a stale mask (see ``invalidate``).
    """
    key = (q_len, kv_len, _version(meta.query_lens), _version(meta.kv_lens))
    mask = meta.mask_cache.get(key)
    if mask is None:
        mask = meta.mask_cache[key] = _build_mask(meta, q_len, kv_len)
    return mask


def _build_mask(meta: RaggedAttentionMetadata, q_len: int, kv_len: int) -> torch.Tensor:
    device = meta.query_lens.device
    q_idx = torch.arange(q_len, device=device)  # [Q]
    k_idx = torch.arange(kv_len, device=device)  # [L]
    q_pos = (meta.kv_lens - meta.query_lens)[:, None] + q_idx[None, :]  # [B, Q] absolute positions
    mask = k_idx[None, None, :] <= q_pos[:, :, None]  # [B, Q, L]
    mask &= k_idx[None, None, :] < meta.kv_lens[:, None, None]
    padding = q_idx[None, :] >= meta.query_lens[:, None]  # [B, Q]
    mask |= padding[:, :, None] & (k_idx[None, None, :] == 0)
    return mask[:, None]


def sdpa_ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA with an explicit ragged causal mask; returns ``[B, Q, Hq, D]`` as transformers expects."""
    meta = kwargs.get("spec_attn_metadata")
    if not isinstance(meta, RaggedAttentionMetadata):
        raise ValueError(
            "spec_backend attention needs spec_attn_metadata=RaggedAttentionMetadata(...) in the forward "
            f"kwargs, got {type(meta).__name__}"
        )
    invariant = getattr(getattr(module, "config", None), "spec_batch_invariant", False)
    rows = native_attention_rows(query, key, value, meta, scaling) if invariant else None
    if rows is not None:
        return rows, None
    n_rep = query.shape[1] // key.shape[1]
    gqa: dict[str, Any] = {}
    if n_rep > 1 and _SDPA_GQA:  # grouped-query attention inside SDPA: no copies of the kv heads
        gqa["enable_gqa"] = True
    elif n_rep > 1:  # older torch: share each kv head across n_rep query heads by copying
        key = key.repeat_interleave(n_rep, dim=1)
        value = value.repeat_interleave(n_rep, dim=1)
    if invariant:
        return _batch_invariant(query, key, value, meta, scaling, gqa), None
    mask = ragged_causal_mask(meta, query.shape[2], key.shape[2])  # [B, 1, Q, L]
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, **gqa
    )  # [B, Hq, Q, D]
    return out.transpose(1, 2).contiguous(), None


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
    if head_dim % 16 or head_dim > 256:
        return None
    scale = scaling if scaling is not None else head_dim**-0.5
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
) -> torch.Tensor:  # [B, Q, Hq, D]
    """Attention whose every row is computed the same way whatever else the step holds: each request on
    exactly its own keys (no padding), and in a decode or verify step each query row alone over the keys
    it sees. A token verified among K+1 drafts then gets bit for bit the hidden state it gets when
    decoded alone, which models with rounding steps inside (bfloat16 activations of packed int4 layers)
    need for speculative greedy output to equal plain greedy output. Costs one small SDPA call per row.
    The fallback where ``native_attention_rows`` is unavailable."""
    out = query.new_zeros(query.shape)  # [B, Hq, Q, D]; padding rows stay 0 (ignored)
    q_lens, kv_lens = meta.query_lens.tolist(), meta.kv_lens.tolist()
    for b, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens, strict=True)):
        k, v, first = key[b : b + 1, :, :kv_len], value[b : b + 1, :, :kv_len], kv_len - q_len
        if q_len > ROW_BY_ROW:  # a prefill; SDPA's last bits here depend on the prompt's length
            mask = (
                torch.arange(kv_len, device=query.device)[None]
                <= (first + torch.arange(q_len, device=query.device))[:, None]
            )
            out[b, :, :q_len] = F.scaled_dot_product_attention(
                query[b : b + 1, :, :q_len], k, v, attn_mask=mask, scale=scaling, **gqa
            )[0]
            continue
        for i in range(q_len):  # row i sees positions 0 .. first + i
            out[b, :, i] = F.scaled_dot_product_attention(
                query[b : b + 1, :, i : i + 1],
                k[:, :, : first + i + 1],
                v[:, :, : first + i + 1],
                scale=scaling,
                **gqa,
            )[0, :, 0]
    return out.transpose(1, 2).contiguous()
