"""Shared helpers for the CUDA backend tests: ragged batches, a pure-torch flash-attn stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from spec_backend.backends.attention import sdpa_ragged_attention
from spec_backend.step import RaggedAttentionMetadata


def ragged_batch(
    batch: int,
    q_len: int,
    heads: int,
    kv_heads: int,
    dim: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    max_prefix: int = 40,
    seed: int = 0,
    query_lens: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RaggedAttentionMetadata]:
    """query ``[B, Hq, Q, D]``, key/value ``[B, Hkv, L, D]`` (views of a wider cache) and lengths.

    Per request ``1 <= q <= Q`` (or ``query_lens``) and ``kv = q + prefix``. Values are rounded
    through float16 so that every dtype sees the same numbers.
    """
    gen = torch.Generator().manual_seed(seed)
    q_lens = (
        torch.tensor(query_lens, dtype=torch.int64)
        if query_lens is not None
        else torch.randint(1, q_len + 1, (batch,), generator=gen)
    )
    kv_lens = q_lens + torch.randint(0, max_prefix + 1, (batch,), generator=gen)
    length = int(kv_lens.max())

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).half().to(dtype).to(device)

    query = rand(batch, heads, q_len, dim)
    cache_k = rand(batch, kv_heads, length + 16, dim)  # [B, Hkv, capacity, D]: the view is not contiguous
    cache_v = rand(batch, kv_heads, length + 16, dim)
    meta = RaggedAttentionMetadata(query_lens=q_lens.to(device), kv_lens=kv_lens.to(device))
    return query, cache_k[:, :, :length], cache_v[:, :, :length], meta


def real_rows(out: torch.Tensor, meta: RaggedAttentionMetadata) -> list[torch.Tensor]:
    """Per request, the real query rows of an attention output ``[B, Q, H, D]``."""
    return [out[b, : int(q)] for b, q in enumerate(meta.query_lens.tolist())]


def reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    meta: RaggedAttentionMetadata,
    window: int | None = None,
) -> torch.Tensor:  # [B, Q, Hq, D] float32
    """The reference attention in float32 on CPU (with a sliding window of ``window`` where given)."""
    cpu = RaggedAttentionMetadata(meta.query_lens.cpu(), meta.kv_lens.cpu())
    out, _ = sdpa_ragged_attention(
        torch.nn.Identity(),
        query.float().cpu(),
        key.float().cpu(),
        value.float().cpu(),
        None,
        spec_attn_metadata=cpu,
        sliding_window=window,
    )
    return out


def emulated_flash_with_kvcache(
    q: torch.Tensor,  # [B, Q, Hq, D]
    k_cache: torch.Tensor,  # [B, L, Hkv, D]
    v_cache: torch.Tensor,  # [B, L, Hkv, D]
    cache_seqlens: torch.Tensor,  # [B] int32
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int] = (-1, -1),
) -> torch.Tensor:  # [B, Q, Hq, D]
    """flash-attn's documented ``flash_attn_with_kvcache`` semantics in plain torch (float32 math).

    Request ``b`` sees keys ``[0, cache_seqlens[b])``; with ``causal`` the mask is aligned to the
    bottom-right corner: query ``j`` sees keys ``<= cache_seqlens[b] - Q + j``. With ``window_size =
    (left, right)`` other than ``(-1, -1)`` (local attention; README: keys in ``[j + s - Q - left,
    j + s - Q + right]``) it sees no key before ``cache_seqlens[b] - Q + j - left``. Rows that see no key
    are zero.
    """
    assert causal
    left = window_size[0]
    batch, q_len, heads, _ = q.shape
    rep = heads // k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b in range(batch):
        s = int(cache_seqlens[b])
        k = k_cache[b, :s].float().repeat_interleave(rep, dim=1)  # [s, Hq, D]
        v = v_cache[b, :s].float().repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[b].float(), k) * softmax_scale  # [Hq, Q, s]
        diagonal = (s - q_len + torch.arange(q_len))[:, None]  # [Q, 1]
        allowed = torch.arange(s)[None, :] <= diagonal  # [Q, s]
        if left >= 0:
            allowed &= torch.arange(s)[None, :] >= diagonal - left
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows without keys -> 0
        out[b] = torch.einsum("hqk,khd->qhd", probs, v)
    return out.to(q.dtype)


def tree_spec(method: str, target: str, tmp: Path, k: int, tree: str, nodes: int) -> dict[str, Any]:
    """A token tree's ``speculative_config`` for ``target``: ``dspark`` or ``eagle3`` drafting the static
    ``tree``, or ``eagle3-dynamic`` growing EAGLE-2's tree of ``nodes`` (2 expansions per level)."""
    from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3
    from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark

    head = (
        write_dspark(tmp / "dspark", target, block_size=4)
        if method == "dspark"
        else write_eagle3(tmp / "eagle3", target, "speculators", aux_ids=[0, 1, 1])
    )
    shape = (
        {"tree_top_k": 2, "tree_nodes": nodes}
        if method.endswith("dynamic")
        else {"speculative_token_tree": tree}
    )
    return {"method": method.removesuffix("-dynamic"), "model": head, "num_speculative_tokens": k, **shape}
