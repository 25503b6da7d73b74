# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""Ragged attention as one triton kernel that reads only each request's valid keys.

The SDPA path (``spec_backend.backends.attention.sdpa_ragged_attention``) attends over the whole cache
view of every request under an explicit ``[B, 1, Q, L]`` mask: a decode step whose requests hold a
hundred tokens in a 4,096-position cache reads 4,096 keys per request and builds the mask in several
kernels first. This kernel loops over key blocks up to each request's ``kv_len`` (read on the device, so
one launch serves every step and it can be captured in a CUDA graph) and applies the contract's causal
rule, a sliding window, a logit soft cap and attention sinks inside its online softmax.

Contract (the reference's): request ``b`` carries ``query_lens[b]`` real query rows right-padded to
``Q``; its cache view holds ``kv_lens[b]`` valid keys including this step's; real query ``i`` sits at
position ``kv_lens[b] - query_lens[b] + i`` and sees every key up to it (the last ``W`` with a window
``W``). Padding rows see every valid key (within the window): their outputs are finite and unused; a row
that sees no key (a padded request with no keys) is written as zeros.

Glossary: *group* — the query heads sharing one kv head (grouped-query attention); one program serves
``BLOCK_M`` rows of one request's kv head, a row being (query head of the group, query position), so each
key block is read once for the whole group. *Online softmax* — the running maximum ``m``, the running
sum ``l`` and the unnormalised output rescaled as each key block arrives (a sink starts ``m`` at its logit
and ``l`` at 1: one more softmax column, with no value).

Token trees (an ancestor mask) are not computed here: the SDPA path serves them. The engine's lengths
always satisfy ``query_lens[b] <= kv_lens[b] <= L`` (a step's keys are in the view); outside that the
kernel does not clip as the reference's mask does (rows before position 0 are written as zeros).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from spec_backend.backends.attention import LayerAttention, layer_attention, ragged_metadata
from spec_backend.step import RaggedAttentionMetadata

try:
    import triton
    import triton.language as tl
except ImportError:  # the path then reports why it cannot run (``triton_unsupported_reason``)
    triton = None

#: dtypes the kernel computes (scores and the softmax in float32 whatever the inputs)
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: the largest head dim the kernel tiles in one block (a query row and an output row in registers)
TRITON_MAX_HEAD_DIM = 256


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_unsupported_reason(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: RaggedAttentionMetadata
) -> str | None:
    """Why the triton kernel cannot compute this call (``None``: it can), from shapes, dtypes and the
    device only, never values."""
    if triton is None:
        return "triton is not installed"
    if query.device.type != "cuda" and not _interpreted():
        where = query.device.type
        return f"tensors are on {where} (the kernel runs on CUDA, or anywhere under TRITON_INTERPRET=1)"
    if query.dtype not in TRITON_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        dtypes = f"{query.dtype}/{key.dtype}/{value.dtype}"
        return f"dtypes {dtypes} (the kernel takes one of float16, bfloat16, float32 for all three)"
    if max(query.shape[-1], value.shape[-1]) > TRITON_MAX_HEAD_DIM:
        return (
            f"head dim {max(query.shape[-1], value.shape[-1])} (the kernel tiles up to {TRITON_MAX_HEAD_DIM})"
        )
    if query.shape[1] % key.shape[1]:
        return f"{query.shape[1]} query heads do not group over {key.shape[1]} kv heads"
    if meta.tree is not None:
        return "a token tree's ancestor mask (the SDPA path serves trees)"
    return None


#: shared memory a launch may use: the smallest per-block limit of the GPUs the backend runs on
#: (compute capability 8.6 and 8.9: 99 KiB; 8.0: 163 KiB; 9.0: 227 KiB)
SHARED_MEMORY_BUDGET = 99 * 1024


def _tile(dim: int) -> int:
    """A head dim's tile: the next power of two, at least 16 (the tail masked)."""
    return max(16, int(triton.next_power_of_2(dim)))


@dataclass(frozen=True)
class LaunchConfig:
    """One launch's tiles: rows (``block_m``) and keys (``block_n``) per program, the head dims' tiles
    and the software pipeline's depth (``num_stages``)."""

    block_m: int
    block_n: int
    block_d: int
    block_dv: int
    num_stages: int


def launch_config(dtype: torch.dtype, rows: int, head_dim: int, value_dim: int) -> LaunchConfig:
    """Tiles of at least 16 (``tl.dot``'s smallest), fewer rows and keys with wide heads, and for
    float32 (whose IEEE products stage both operands in shared memory) 32 each and no pipelining: every
    configuration stays within ``SHARED_MEMORY_BUDGET`` (checked by compiling them, on CPU, in
    ``test_cuda_triton_attention.py``)."""
    wide = max(head_dim, value_dim) > 128
    widest = 32 if wide or dtype == torch.float32 else 64
    block_m = min(widest, max(16, int(triton.next_power_of_2(rows))))
    stages = 1 if dtype == torch.float32 else 2
    return LaunchConfig(block_m, widest, _tile(head_dim), _tile(value_dim), stages)


def triton_attention(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, Dv]
    meta: RaggedAttentionMetadata,
    scale: float,
    layer: LayerAttention,
) -> torch.Tensor:  # [B, Q, Hq, Dv]
    """The kernel over one call's tensors (any strides; the output is contiguous)."""
    batch, heads, q_len, head_dim = query.shape
    kv_heads, value_dim = key.shape[1], value.shape[-1]
    group = heads // kv_heads
    out = torch.empty((batch, q_len, heads, value_dim), dtype=query.dtype, device=query.device)
    if out.numel() == 0:
        return out
    tiles = launch_config(query.dtype, group * q_len, head_dim, value_dim)
    sinks = layer.sinks.float().contiguous() if layer.sinks is not None else out  # [Hq]; unread without
    grid = (batch * kv_heads, triton.cdiv(group * q_len, tiles.block_m))
    _ragged_attention_kernel[grid](
        query, key, value, out, meta.query_lens, meta.kv_lens, sinks,
        *query.stride(), *key.stride(), *value.stride(), *out.stride(),
        meta.query_lens.stride(0), meta.kv_lens.stride(0),
        q_len, group, kv_heads, head_dim, value_dim, float(scale),
        float(layer.softcap or 1.0), int(layer.window or 1),
        HAS_SINKS=layer.sinks is not None, HAS_SOFTCAP=layer.softcap is not None,
        HAS_WINDOW=layer.window is not None,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_D=tiles.block_d, BLOCK_DV=tiles.block_dv,
        num_stages=tiles.num_stages,
    )  # fmt: skip
    return out


def triton_ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, Dv]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The triton path as an ``AttentionInterface`` function; returns ``[B, Q, Hq, Dv]``. A call it
    cannot compute is refused by name (``ValueError``), never computed another way."""
    del attention_mask  # the lengths define the mask
    meta, layer = ragged_metadata(kwargs, module), layer_attention(kwargs)
    reason = triton_unsupported_reason(query, key, value, meta)
    if reason is None and dropout:
        reason = "dropout > 0"
    if reason is not None:
        raise ValueError(f"the triton attention path cannot run here: {reason}")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return triton_attention(query, key, value, meta, scale, layer), None


if triton is not None:

    @triton.jit
    def _tanh(x):  # jit functions take no annotations (triton resolves their names as globals)
        return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0  # saturates to ±1, no inf/inf

    @triton.jit
    def _scores(
        q, k, n, pos, kv_len, scale, softcap, window, HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr
    ):  # fmt: skip
        """One key block's scores ``[M, N]`` (float32; IEEE products for float32 inputs), soft-capped,
        ``-inf`` where a row may not see a key."""
        s = tl.dot(q, k, input_precision="ieee") * scale
        if HAS_SOFTCAP:
            s = softcap * _tanh(s / softcap)
        seen = (n[None, :] <= pos[:, None]) & (n[None, :] < kv_len)
        if HAS_WINDOW:
            seen = seen & (n[None, :] > pos[:, None] - window)
        return tl.where(seen, s, float("-inf"))

    @triton.jit
    def _ragged_attention_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, q_lens_ptr, kv_lens_ptr, sinks_ptr,
        sqb, sqh, sqq, sqd, skb, skh, skl, skd, svb, svh, svl, svd, sob, soq, soh, sod, sql, skv,
        q_len, group, kv_heads, head_dim, value_dim, scale, softcap, window,
        HAS_SINKS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    ):  # fmt: skip
        b = (tl.program_id(0) // kv_heads).to(tl.int64)  # 64-bit offsets: B * stride may pass 2^31
        kv_head = tl.program_id(0) % kv_heads
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [M] (head of the group, query)
        live = rows < group * q_len
        head, qi = kv_head * group + rows // q_len, rows % q_len  # [M], [M]
        kv_len = tl.load(kv_lens_ptr + b * skv)  # the lengths may be strided views
        first = kv_len - tl.load(q_lens_ptr + b * sql)  # the position of the request's first query
        pos = first + qi  # [M]
        d, dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        q = tl.load(
            q_ptr + b * sqb + head[:, None] * sqh + qi[:, None] * sqq + d[None, :] * sqd,
            mask=live[:, None] & (d[None, :] < head_dim),
            other=0.0,
        )  # [M, D]
        if HAS_SINKS:  # the sink's column: m starts at its logit, its weight exp(0) = 1
            m = tl.load(sinks_ptr + head, mask=live, other=0.0).to(tl.float32)  # [M]
            total = tl.full([BLOCK_M], 1.0, tl.float32)
        else:
            m = tl.full([BLOCK_M], float("-inf"), tl.float32)
            total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        lo = 0
        if HAS_WINDOW:
            lo = tl.maximum(first - window + 1, 0)  # the first query's window starts the earliest
        for start in range(lo, kv_len, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)  # [N]
            k = tl.load(
                k_ptr + b * skb + kv_head * skh + n[None, :] * skl + d[:, None] * skd,
                mask=(n[None, :] < kv_len) & (d[:, None] < head_dim),
                other=0.0,
            )  # [D, N]
            s = _scores(q, k, n, pos, kv_len, scale, softcap, window, HAS_SOFTCAP, HAS_WINDOW)  # [M, N]
            m_new = tl.maximum(m, tl.max(s, 1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
            p = tl.exp(s - shift[:, None])  # [M, N]
            alpha = tl.exp(m - shift)
            total = total * alpha + tl.sum(p, 1)
            v = tl.load(
                v_ptr + b * svb + kv_head * svh + n[:, None] * svl + dv[None, :] * svd,
                mask=(n[:, None] < kv_len) & (dv[None, :] < value_dim),
                other=0.0,
            )  # [N, Dv]
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m = m_new
        out = tl.where(total[:, None] > 0, acc / tl.where(total > 0, total, 1.0)[:, None], 0.0)
        tl.store(
            o_ptr + b * sob + qi[:, None] * soq + head[:, None] * soh + dv[None, :] * sod,
            out.to(o_ptr.dtype.element_ty),
            mask=live[:, None] & (dv[None, :] < value_dim),
        )


__all__ = [
    "SHARED_MEMORY_BUDGET",
    "TRITON_DTYPES",
    "TRITON_MAX_HEAD_DIM",
    "LaunchConfig",
    "launch_config",
    "triton_attention",
    "triton_ragged_attention",
    "triton_unsupported_reason",
]
