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

from typing import Any

import torch
import torch.nn.functional as F

from spec_backend.step import RaggedAttentionMetadata

#: ``scaled_dot_product_attention(enable_gqa=...)`` exists from torch 2.5.
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


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


def ragged_metadata(kwargs: dict[str, Any]) -> RaggedAttentionMetadata:
    """The step's ``spec_attn_metadata`` from an attention call's keyword arguments (a clear error when a
    forward was called without it)."""
    meta = kwargs.get("spec_attn_metadata")
    if not isinstance(meta, RaggedAttentionMetadata):
        raise ValueError(
            "spec_backend attention needs spec_attn_metadata=RaggedAttentionMetadata(...) in the forward "
            f"kwargs, got {type(meta).__name__}"
        )
    return meta


def grouped_kv(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Keys, values and SDPA's keyword arguments for grouped-query attention: ``enable_gqa`` where torch
    has it (no copies of the kv heads), else each kv head copied across its query heads."""
    n_rep = query.shape[1] // key.shape[1]
    if n_rep > 1 and _SDPA_GQA:
        return key, value, {"enable_gqa": True}
    if n_rep > 1:  # older torch
        return key.repeat_interleave(n_rep, dim=1), value.repeat_interleave(n_rep, dim=1), {}
    return key, value, {}


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
    meta = ragged_metadata(kwargs)
    del module, attention_mask, dropout  # the lengths define the mask; inference only
    key, value, gqa = grouped_kv(query, key, value)
    mask = ragged_causal_mask(meta, query.shape[2], key.shape[2])  # [B, 1, Q, L]
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, **gqa
    )  # [B, Hq, Q, D]
    return out.transpose(1, 2).contiguous(), None
