"""Shared helpers: random ragged batches and the reference attention restricted to real rows."""

from __future__ import annotations

import torch

from spec_backend.backends.attention import sdpa_ragged_attention
from spec_backend.step import RaggedAttentionMetadata


def ragged_batch(
    gen: torch.Generator,
    batch: int,
    q_len: int,
    heads: int,
    kv_heads: int,
    dim: int,
    dtype: torch.dtype = torch.float32,
    max_prefix: int = 40,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RaggedAttentionMetadata]:
    """query [B, Hq, Q, D], key/value [B, Hkv, L, D] and per-request lengths (q <= Q, kv >= q).

    Values are rounded through float16 so that casting to the op's dtype is exact.
    """
    query_lens = torch.randint(1, q_len + 1, (batch,), generator=gen)
    kv_lens = query_lens + torch.randint(0, max_prefix + 1, (batch,), generator=gen)
    length = int(kv_lens.max())

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).half().to(dtype)

    query = rand(batch, heads, q_len, dim)
    key, value = rand(batch, kv_heads, length, dim), rand(batch, kv_heads, length, dim)
    return query, key, value, RaggedAttentionMetadata(query_lens, kv_lens)


def reference(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: RaggedAttentionMetadata
) -> torch.Tensor:  # [B, Q, Hq, D] float32
    out, _ = sdpa_ragged_attention(
        torch.nn.Module(), query.float(), key.float(), value.float(), None, spec_attn_metadata=meta
    )
    return out


def real_rows(meta: RaggedAttentionMetadata, q_len: int) -> torch.Tensor:  # [B, Q] bool
    return torch.arange(q_len)[None, :] < meta.query_lens[:, None]
