"""Fake ``npu_fused_infer_attention_score``: the documented signature, validated, computed on CPU.

Validation follows the public torch_npu documentation of the op (Atlas A2/A3): float16/bfloat16
only, contiguous inputs, the supported layouts, GQA ratio <= 64, N <= 256, D <= 512 and 16-aligned,
``sparse_mode`` 0 (no mask, or an explicit ``(Sq, Skv)`` / ``(1, Sq, Skv)`` / ``(B, 1, Sq, Skv)`` /
``(B, N, Sq, Skv)`` mask outside TND, 1 = not attended) and 2-4 with the fixed 2048x2048 compressed
mask (3: right-down causal; 4: band, keys from ``pre_tokens`` before to ``next_tokens`` after each
query's right-down diagonal, with ``pre_tokens + next_tokens >= 0``; both ignored, like the mask, when the
query's S is 1), TND needs cumulative
``actual_seq_lengths`` (non-decreasing, last = T) and only ``sparse_mode`` 0 without mask or 3 with
mask, page attention needs ``block_table`` int32 ``[B, >= max blocks]``, block sizes that are
multiples of 128 in [128, 512] and per-request ``actual_seq_lengths_kv``; the TND decode path holds
0..16 query tokens per request (a zero-length request repeats the previous cumulative length) and takes
head dims 64, 128 and 192 only (error 561002 otherwise, CANN's text as vllm-ascend PR #9632 quotes it);
``BNSD_BSND`` needs a query S > 1; a query as long as its keys is fine with ``sparse_mode=3``.
Anything this fake does not emulate (quantisation, pse, prefix, rope, left padding) raises
``NotImplementedError`` instead of being silently ignored.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

_DTYPES = (torch.float16, torch.bfloat16)
_MASK_DTYPES = (torch.bool, torch.int8, torch.uint8)
_LAYOUTS = ("TND", "BNSD", "BSND", "BSH", "BNSD_BSND")
_INT_MAX = 2147483647
MAX_DECODE_QUERY_TOKENS = 16
#: TND head dims (q = k = v); source: CANN's error text quoted in vllm-ascend PR #9632
TND_HEAD_DIMS = (64, 128, 192)
_UNSUPPORTED = [
    "pse_shift",
    "dequant_scale1",
    "quant_scale1",
    "dequant_scale2",
    "quant_scale2",
    "quant_offset2",
    "antiquant_scale",
    "antiquant_offset",
    "query_padding_size",
    "kv_padding_size",
    "key_antiquant_scale",
    "key_antiquant_offset",
    "value_antiquant_scale",
    "value_antiquant_offset",
    "key_shared_prefix",
    "value_shared_prefix",
    "actual_shared_prefix_len",
    "query_rope",
    "key_rope",
    "key_rope_antiquant_scale",
]


def _fail(message: str) -> None:
    raise RuntimeError(f"npu_fused_infer_attention_score: {message}")


def _check_lengths(name: str, values: Any) -> list[int]:
    if isinstance(values, torch.Tensor) or not isinstance(values, (list, tuple)):
        raise TypeError(f"npu_fused_infer_attention_score: {name} must be a list of ints (SymInt[])")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        _fail(f"{name} must hold non-negative ints, got {values}")
    return list(values)


def _to_bnsd(t: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout in ("BNSD", "BNSD_BSND"):
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    return t.unflatten(2, (heads, -1)).transpose(1, 2)  # BSH


#: (pre_tokens, next_tokens) around each query's right-down diagonal; None: no mask
Band = tuple[int, int] | None


def _attend(
    q: torch.Tensor,  # [N, Sq, D] (one request, real rows only)
    k: torch.Tensor,  # [Nkv, Skv, D]
    v: torch.Tensor,  # [Nkv, Skv, D]
    scale: float,
    band: Band,
    hidden: torch.Tensor | None = None,  # [N or 1, Sq, Skv] bool: an explicit mask (True: not attended)
) -> torch.Tensor:  # [N, Sq, D] float32
    rep = q.shape[0] // k.shape[0]
    k, v = k.float().repeat_interleave(rep, 0), v.float().repeat_interleave(rep, 0)
    scores = scale * q.float() @ k.transpose(1, 2)  # [N, Sq, Skv]
    if hidden is not None:
        if bool(hidden.all(dim=-1).any()):
            _fail("atten_mask hides every key of a query row within its actual lengths")
        scores = scores.masked_fill(hidden, float("-inf"))
    if band is not None:  # right-down origin: query i's diagonal is key Skv - Sq + i
        sq, skv = q.shape[1], k.shape[1]
        diagonal = (skv - sq + torch.arange(sq))[:, None]  # [Sq, 1]
        keys = torch.arange(skv)[None, :]  # [1, Skv]
        allowed = (keys <= diagonal + band[1]) & (keys >= diagonal - band[0])
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _explicit_mask(mask: torch.Tensor, batch: int, heads: int, sq: int, skv: int) -> torch.Tensor:
    """A ``sparse_mode=0`` mask as ``[B, N or 1, Sq, Skv]`` bool. The op documents the shapes
    ``(Sq, Skv)``, ``(1, Sq, Skv)``, ``(B, 1, Sq, Skv)`` and ``(B, N, Sq, Skv)``, 1 where a query does not
    attend a key, over the query's and keys' full S (not the actual lengths)."""
    shape = tuple(mask.shape)
    allowed = {(sq, skv), (1, sq, skv), (1, 1, sq, skv), (batch, 1, sq, skv), (batch, heads, sq, skv)}
    if shape not in allowed:
        _fail(f"atten_mask shape {shape} is not one of {sorted(allowed)} for Sq={sq}, Skv={skv}")
    if not mask.is_contiguous():
        _fail("atten_mask must be contiguous")
    full = mask.bool().reshape(shape if mask.dim() == 4 else (1, 1, sq, skv))
    return full.expand(batch, -1, -1, -1)


def _check_mask(
    sparse_mode: int, mask: torch.Tensor | None, layout: str, pre_tokens: int, next_tokens: int
) -> Band:
    if sparse_mode not in (0, 1, 2, 3, 4):
        _fail(f"sparse_mode must be 0, 1, 2, 3 or 4, got {sparse_mode}")
    if layout == "TND" and not (
        (sparse_mode == 0 and mask is None) or (sparse_mode == 3 and mask is not None)
    ):
        _fail("TND supports sparse_mode=0 without atten_mask or sparse_mode=3 with atten_mask only")
    if mask is not None and mask.dtype not in _MASK_DTYPES:
        _fail(f"atten_mask dtype must be bool, int8 or uint8, got {mask.dtype}")
    if sparse_mode in (2, 3, 4):
        if mask is None or tuple(mask.shape)[-2:] != (2048, 2048) or mask.numel() != 2048 * 2048:
            _fail(f"sparse_mode={sparse_mode} needs the compressed (2048, 2048) atten_mask")
        if not torch.equal(mask.bool(), torch.ones(2048, 2048, dtype=torch.bool).triu(1).view(mask.shape)):
            _fail("the compressed atten_mask must be 1 strictly above the diagonal, 0 elsewhere")
        if sparse_mode == 3:
            return _INT_MAX, 0  # right-down causal: pre_tokens / next_tokens ignored
        if sparse_mode == 4:
            if pre_tokens + next_tokens < 0:
                _fail(f"sparse_mode=4 needs pre_tokens + next_tokens >= 0, got {pre_tokens} + {next_tokens}")
            return pre_tokens, next_tokens
        raise NotImplementedError(f"fake torch_npu emulates sparse_mode 0, 3 and 4, not {sparse_mode}")
    if mask is not None and sparse_mode != 0:
        raise NotImplementedError("fake torch_npu emulates an explicit atten_mask with sparse_mode 0 only")
    return None  # sparse_mode 0: no band; an explicit mask is applied by _batched


def _paged_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    table: torch.Tensor,
    block_size: int,
    kv_lens: list[int],
    n_kv: int,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-request ``[Nkv, kv_len, D]`` keys/values gathered from pages."""
    if table.dtype != torch.int32 or table.dim() != 2:
        _fail(f"block_table must be a 2-D int32 tensor, got {table.dtype} {tuple(table.shape)}")
    if block_size % 128 or not 128 <= block_size <= 512:
        _fail(f"block_size must be a multiple of 128 in [128, 512] with page attention, got {block_size}")
    if key.dim() == 4:  # (blocknum, KV_N, blocksize, D)
        if key.shape[1] != n_kv or key.shape[2] != block_size:
            _fail(f"paged key {tuple(key.shape)} must be (blocknum, {n_kv}, {block_size}, D)")
        pages_k, pages_v = key.transpose(1, 2), value.transpose(1, 2)  # [blocks, bs, Nkv, D]
    elif key.dim() == 3:  # (blocknum, blocksize, H)
        pages_k, pages_v = key.unflatten(2, (n_kv, -1)), value.unflatten(2, (n_kv, -1))
    else:
        _fail(f"paged key must be 3-D or 4-D, got {tuple(key.shape)}")
    if len(kv_lens) != table.shape[0]:
        _fail(f"actual_seq_lengths_kv has {len(kv_lens)} entries, block_table has {table.shape[0]} rows")
    out = []
    for b, kv in enumerate(kv_lens):
        needed = -(-kv // block_size)
        if needed > table.shape[1]:
            _fail(f"request {b}: kv length {kv} needs {needed} blocks, block_table has {table.shape[1]}")
        ids = table[b, :needed].long()
        if ids.numel() and (ids.min() < 0 or ids.max() >= pages_k.shape[0]):
            _fail(f"request {b}: block ids out of range for {pages_k.shape[0]} blocks")
        k = pages_k[ids].flatten(0, 1)[:kv].permute(1, 0, 2)  # [Nkv, kv, D]
        out.append((k, pages_v[ids].flatten(0, 1)[:kv].permute(1, 0, 2)))
    return out


def fused_infer_attention_score(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: list[int] | None = None,
    actual_seq_lengths_kv: list[int] | None = None,
    block_table: torch.Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    pre_tokens: int = _INT_MAX,
    next_tokens: int = _INT_MAX,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    inner_precise: int = 0,
    block_size: int = 0,
    antiquant_mode: int = 0,
    softmax_lse_flag: bool = False,
    key_antiquant_mode: int = 0,
    value_antiquant_mode: int = 0,
    **unsupported: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate like the device op, then compute attention with reference torch ops (float32)."""
    for name in unsupported:
        if name not in _UNSUPPORTED:
            raise TypeError(f"npu_fused_infer_attention_score() got an unexpected keyword argument {name!r}")
        if unsupported[name] is not None:
            raise NotImplementedError(f"fake torch_npu does not emulate {name}")
    if softmax_lse_flag or antiquant_mode or key_antiquant_mode or value_antiquant_mode:
        raise NotImplementedError("fake torch_npu does not emulate softmax_lse or antiquantisation")
    if inner_precise not in (0, 1, 2, 3):
        _fail(f"inner_precise must be 0..3, got {inner_precise}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dtype not in _DTYPES:
            _fail(f"{name} dtype must be float16 or bfloat16, got {t.dtype}")
        if not t.is_contiguous():
            _fail(f"{name} must be contiguous")
    if key.dtype != query.dtype or value.dtype != query.dtype or key.shape != value.shape:
        _fail("key and value must match query's dtype and each other's shape")
    if input_layout not in _LAYOUTS:
        raise NotImplementedError(f"fake torch_npu emulates layouts {_LAYOUTS}, not {input_layout!r}")
    n_kv = num_key_value_heads or num_heads
    if num_heads < 1 or num_heads > 256 or num_heads % n_kv or num_heads // n_kv > 64:
        _fail(f"num_heads={num_heads}, num_key_value_heads={n_kv}: need N <= 256, N % Nkv == 0, N/Nkv <= 64")
    dim = query.shape[-1] if input_layout != "BSH" else query.shape[-1] // num_heads
    if dim > 512 or dim % 16:
        _fail(f"head dim must be 16-aligned and <= 512 for float16/bfloat16, got {dim}")
    band = _check_mask(sparse_mode, atten_mask, input_layout, pre_tokens, next_tokens)
    if input_layout == "TND" and dim not in TND_HEAD_DIMS:
        _fail(  # CANN's check, as quoted in vllm-ascend PR #9632
            f"call aclnnFusedInferAttentionScoreV3 failed, error code is 561002: When layout is TND, "
            f"queryD({dim}), keyD({dim}) and valueD({dim}) must be same equal 192/128/64, or queryD and "
            "keyD equal 192 and valueD equal 128."
        )
    if input_layout == "BNSD_BSND" and query.shape[2] <= 1:
        _fail("input_layout BNSD_BSND (BNSD in, BSND out) supports only query S > 1")
    if input_layout == "TND":
        out = _tnd(
            query,
            key,
            value,
            actual_seq_lengths,
            actual_seq_lengths_kv,
            block_table,
            block_size,
            num_heads,
            n_kv,
            scale,
            band,
        )
    else:
        explicit = atten_mask if sparse_mode == 0 else None
        out = _batched(
            query,
            key,
            value,
            actual_seq_lengths,
            actual_seq_lengths_kv,
            block_table,
            num_heads,
            n_kv,
            scale,
            band,
            input_layout,
            explicit,
        )
    return out, torch.zeros(1, dtype=torch.float32)


def _tnd(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_cum: Any,
    kv_lens: Any,
    table: torch.Tensor | None,
    block_size: int,
    heads: int,
    n_kv: int,
    scale: float,
    band: Band,
) -> torch.Tensor:  # [T, N, D]
    if query.dim() != 3 or query.shape[1] != heads:
        _fail(f"TND query must be (T, {heads}, D), got {tuple(query.shape)}")
    if q_cum is None or kv_lens is None:
        _fail("TND needs actual_seq_lengths and actual_seq_lengths_kv")
    cum = _check_lengths("actual_seq_lengths", q_cum)
    kv = _check_lengths("actual_seq_lengths_kv", kv_lens)
    if any(b < a for a, b in itertools.pairwise(cum)) or not cum or cum[-1] != query.shape[0]:
        _fail(
            f"TND actual_seq_lengths must be cumulative (non-decreasing) and end at T={query.shape[0]}: {cum}"
        )
    q_lens = [b - a for a, b in zip([0, *cum], cum, strict=False)]
    if table is None:
        raise NotImplementedError("fake torch_npu emulates TND with page attention (block_table) only")
    if any(not 0 <= q <= MAX_DECODE_QUERY_TOKENS for q in q_lens):
        _fail(
            f"the TND decode path supports 0..{MAX_DECODE_QUERY_TOKENS} query tokens per request, "
            f"got {q_lens}"
        )
    if band is not None and any(0 < q > k for q, k in zip(q_lens, kv, strict=False)):
        _fail(f"sparse_mode 3/4 need actual query length <= kv length per request: {q_lens} vs {kv}")
    kvs = _paged_kv(key, value, table, block_size, kv, n_kv)
    out = torch.empty_like(query)
    for b, (k, v) in enumerate(kvs):
        if q_lens[b] == 0:  # a zero-length request (equal consecutive cumulative lengths): no rows
            continue
        rows = slice(cum[b] - q_lens[b], cum[b])
        out[rows] = _attend(query[rows].transpose(0, 1), k, v, scale, band).transpose(0, 1).to(query.dtype)
    return out


def _batched(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_lens: Any,
    kv_lens: Any,
    table: torch.Tensor | None,
    heads: int,
    n_kv: int,
    scale: float,
    band: Band,
    layout: str,
    explicit: torch.Tensor | None = None,
) -> torch.Tensor:
    if table is not None:
        raise NotImplementedError("fake torch_npu emulates page attention with the TND layout only")
    if query.dim() != (3 if layout == "BSH" else 4):
        _fail(f"{layout} query has the wrong rank: {tuple(query.shape)}")
    q, k, v = _to_bnsd(query, layout, heads), _to_bnsd(key, layout, n_kv), _to_bnsd(value, layout, n_kv)
    if q.shape[1] != heads or k.shape[1] != n_kv or k.shape[0] != q.shape[0]:
        _fail(f"{layout} shapes {tuple(query.shape)}/{tuple(key.shape)} disagree with num_heads/num_kv_heads")
    batch, sq, skv = q.shape[0], q.shape[2], k.shape[2]
    ql = _check_lengths("actual_seq_lengths", q_lens) if q_lens is not None else [sq]
    kl = _check_lengths("actual_seq_lengths_kv", kv_lens) if kv_lens is not None else [skv]
    for name, vals, bound in (("actual_seq_lengths", ql, sq), ("actual_seq_lengths_kv", kl, skv)):
        if not (len(vals) == 1 or len(vals) >= batch) or max(vals) > bound:
            _fail(f"{name} needs 1 or >= B={batch} entries, each <= {bound}: {vals}")
    ql = ql * batch if len(ql) == 1 else ql[:batch]
    kl = kl * batch if len(kl) == 1 else kl[:batch]
    if sq == 1:  # op doc: sparse_mode, pre_tokens and next_tokens have no effect when the query's S is 1
        band = None
    if band is not None and any(a > b for a, b in zip(ql, kl, strict=True)):
        _fail(f"sparse_mode 3/4 need actual query length <= kv length per request: {ql} vs {kl}")
    hidden = _explicit_mask(explicit, batch, heads, sq, skv) if explicit is not None else None
    out = torch.zeros_like(q)  # [B, N, Sq, D]; rows beyond a request's actual length stay zero
    for b in range(batch):
        rows = hidden[b, :, : ql[b], : kl[b]] if hidden is not None else None
        out[b, :, : ql[b]] = _attend(
            q[b, :, : ql[b]], k[b, :, : kl[b]], v[b, :, : kl[b]], scale, band, rows
        ).to(q.dtype)
    if layout == "BNSD":
        return out
    if layout == "BSH":
        return out.transpose(1, 2).flatten(2).contiguous()
    return out.transpose(1, 2).contiguous()  # BSND and BNSD_BSND outputs
