"""Ragged attention on Ascend through ``torch_npu.npu_fused_infer_attention_score`` (FIA).

Same contract as the reference (``spec_backend.backends.attention.sdpa_ragged_attention``): request
``b`` carries ``query_lens[b]`` real query rows (right-padded to ``Q``), its cache holds ``kv_lens[b]``
valid keys including this step's, and real query ``i`` sits at position ``kv_lens[b] - query_lens[b] + i``.

Three documented FIA variants are used (every limit is in :mod:`spec_backend_ascend.limits` with its
source):

* **verification / decode** (``Q <= 16``), the path that ACLGraphs capture, for head dims TND accepts
  (64, 128, 192): ``input_layout="TND"`` with the keys presented as a *paged* cache (``block_table``),
  ``sparse_mode=3`` (right-down causal) and the fixed 2048x2048 mask. Every request contributes all
  ``Q`` rows (padding rows included), so the token count ``T = B*Q`` and the cumulative
  ``actual_seq_lengths`` are static; only ``actual_seq_lengths_kv`` changes per step (``kv - q + Q``:
  the padding rows sit after the real ones and the real rows keep their true positions). That single
  per-step parameter is what the graph runner re-issues before every replay (see
  :mod:`spec_backend_ascend.graph_params`).
* **verification / decode for other head dims** (TND fails on them with error 561002):
  ``input_layout="BNSD"`` over the dense cache padded by ``Q`` positions, with the same static query
  lengths and shifted kv lengths, so capture and update work the same way.
* **prefill** (``Q > 16``, beyond the TND decode path's 16-token limit): ``input_layout="BNSD_BSND"``
  over the padded cache with per-request ``actual_seq_lengths`` / ``actual_seq_lengths_kv``.

A token-tree step (``meta.tree``) goes through ``input_layout="BNSD"`` with an explicit
``[B, 1, Q, L]`` boolean mask and ``sparse_mode=0`` (True: the key is hidden), the complement of the
reference's tree visibility; tree steps run eagerly, never inside an ACLGraph.

A layer's sliding window ``W`` (transformers' ``sliding_window=``) is the op's band mode, ``sparse_mode=4``
with ``pre_tokens = W - 1, next_tokens = 0`` around each row's right-down diagonal, so the drafted rows of
a verify step slide with their true positions. TND takes no band mode, so windowed layers verify through
BNSD whatever their head dim; and since the op ignores the band when the query's S is 1, a one-token
decode step is presented with one padding row more (S = 2).

Head dims must be multiples of 16 up to 512 in every layout (float16/bfloat16), and values must have the
keys' head dim; the op has no attention sinks and no logit soft cap. Such layers are refused with a
``ValueError`` before the op is called (and their models at load: ``AscendBackend.prepare_model``).

FIA accepts float16 and bfloat16 only: float32 models run the op in float16 and cast back.
``torch_npu`` is imported lazily, on the first call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from spec_backend.backends.attention import layer_attention, ragged_causal_mask, ragged_metadata
from spec_backend.step import RaggedAttentionMetadata
from spec_backend_ascend.graph_params import CapturedAttention, CaptureRecord, active_capture
from spec_backend_ascend.limits import (
    HEAD_DIM_ALIGN,
    MAX_HEAD_DIM,
    MAX_QUERY_TOKENS_PER_REQUEST,
    PAGE_BLOCK_SIZE,
    SPARSE_MASK_SIZE,
    SPARSE_MODE_BAND,
    SPARSE_MODE_RIGHT_DOWN_CAUSAL,
    TND_HEAD_DIMS,
)
from spec_backend_ascend.npu import npu_namespace, torch_npu_module

#: FIA computes in float16 / bfloat16 only (op-plugin docs torch_npu-npu_fused_infer_attention_score.md).
_OP_DTYPES = (torch.float16, torch.bfloat16)
_MASKS: dict[torch.device, torch.Tensor] = {}


def op_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype FIA computes in for a model in ``dtype`` (float32 is not supported by the op)."""
    return dtype if dtype in _OP_DTYPES else torch.float16


def causal_mask(device: torch.device) -> torch.Tensor:
    """The compressed mask sparse_mode 3 requires: ``[2048, 2048]`` int8, 1 above the diagonal."""
    mask = _MASKS.get(device)
    if mask is None:
        mask = torch.ones(SPARSE_MASK_SIZE, SPARSE_MASK_SIZE, dtype=torch.int8, device=device).triu_(1)
        _MASKS[device] = mask
    return mask


def band(window: int | None) -> dict[str, int]:
    """The op's masking keywords: right-down causal, or the band of a sliding window of ``window``."""
    if window is None:
        return {"sparse_mode": SPARSE_MODE_RIGHT_DOWN_CAUSAL}
    return {"sparse_mode": SPARSE_MODE_BAND, "pre_tokens": window - 1, "next_tokens": 0}


def paged_cache(cache: torch.Tensor, capacity: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Present a padded cache ``[B, H, L, D]`` as pages ``[B*n, H, bs, D]`` plus ``block_table [B, n]``.

    ``capacity`` (a multiple of the block size, >= L) is the page span per request; positions beyond
    ``L`` are zero. Request ``b`` owns pages ``b*n .. b*n+n-1``. This is one copy of the cache per
    layer per step; an engine that allocates its cache in pages natively avoids it.
    """
    batch, heads, length, dim = cache.shape
    blocks = capacity // PAGE_BLOCK_SIZE
    padded = F.pad(cache.to(dtype), (0, 0, 0, capacity - length))  # [B, H, capacity, D]
    pages = padded.view(batch, heads, blocks, PAGE_BLOCK_SIZE, dim).permute(0, 2, 1, 3, 4)  # [B, n, H, bs, D]
    # reshape may return a strided view (batch 1: no copy is needed to merge B and n), which the op
    # must not get: contiguous() makes the copy whenever the view is not already dense
    pages = pages.reshape(batch * blocks, heads, PAGE_BLOCK_SIZE, dim).contiguous()  # [B*n, H, bs, D]
    table = torch.arange(batch * blocks, dtype=torch.int32, device=cache.device).view(batch, blocks)
    return pages, table


def _decode_tnd(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    meta: RaggedAttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [B, Q, Hq, D] in the op dtype
    batch, heads, q_len, dim = query.shape
    dtype = op_dtype(query.dtype)
    capacity = -(-(key.shape[2] + q_len) // PAGE_BLOCK_SIZE) * PAGE_BLOCK_SIZE
    k_pages, table = paged_cache(key, capacity, dtype)
    v_pages, _ = paged_cache(value, capacity, dtype)
    tokens = query.transpose(1, 2).to(dtype).reshape(batch * q_len, heads, dim).contiguous()  # [T, Hq, D]
    call: dict[str, Any] = {
        "query": tokens,
        "key": k_pages,
        "value": v_pages,
        "atten_mask": causal_mask(query.device),
        "block_table": table,
        "actual_seq_lengths": [q_len * (b + 1) for b in range(batch)],  # cumulative, static
        "num_heads": heads,
        "num_key_value_heads": key.shape[1],
        "scale": scale,
        "input_layout": "TND",
        "block_size": PAGE_BLOCK_SIZE,
        "sparse_mode": SPARSE_MODE_RIGHT_DOWN_CAUSAL,
    }
    return _issue(call, meta, batch, q_len, capacity).view(batch, q_len, heads, dim)


def _decode_bnsd(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    meta: RaggedAttentionMetadata,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [B, Q, Hq, D] in the op dtype
    """Verification / decode for head dims TND rejects and for windowed layers: ``input_layout="BNSD"``
    over the dense cache, padded by ``Q`` positions, with the same static query lengths and shifted kv
    lengths as TND (so ACLGraph capture and the per-replay update work unchanged). A windowed layer's
    one-token step gets a padding row (the op ignores the band for S = 1), sliced off the output."""
    rows = query.shape[2]
    if window is not None and rows == 1:
        query = F.pad(query, (0, 0, 0, 1))  # [B, Hq, 2, D]
    batch, heads, q_len, _ = query.shape
    dtype = op_dtype(query.dtype)
    capacity = key.shape[2] + q_len
    call: dict[str, Any] = {
        "query": query.to(dtype).contiguous(),
        "key": F.pad(key.to(dtype), (0, 0, 0, q_len)).contiguous(),  # [B, Hkv, L + Q, D]
        "value": F.pad(value.to(dtype), (0, 0, 0, q_len)).contiguous(),
        "atten_mask": causal_mask(query.device),
        "actual_seq_lengths": [q_len] * batch,  # per request, static: padding rows included
        "num_heads": heads,
        "num_key_value_heads": key.shape[1],
        "scale": scale,
        "input_layout": "BNSD",
        **band(window),
    }
    out = _issue(call, meta, batch, q_len, capacity).transpose(1, 2)  # [B, N, Q, D] -> [B, Q, N, D]
    return out[:, :rows]


def _issue(
    call: dict[str, Any], meta: RaggedAttentionMetadata, batch: int, q_len: int, capacity: int
) -> torch.Tensor:  # the op's output
    """Run the decode call, or record it into the graph being captured (with updatable kv lengths).

    Every request presents all ``q_len`` query rows (padding rows after the real ones), so its kv length
    is shifted by its padding: ``kv - q + q_len`` keeps each real row at its true position under
    right-down causal masking.
    """
    record = active_capture()
    if record is not None:
        return _captured_call(record, call, batch, q_len, capacity, meta.ring_margin)
    q_list = [int(v) for v in meta.query_lens.tolist()]
    kv_list = [int(v) for v in meta.kv_lens.tolist()]
    kv_shifted = [kv - q + q_len for q, kv in zip(q_list, kv_list, strict=True)]
    out, _ = torch_npu_module().npu_fused_infer_attention_score(**call, actual_seq_lengths_kv=kv_shifted)
    return out  # type: ignore[no-any-return]


def _captured_call(
    record: CaptureRecord,
    call: dict[str, Any],
    batch: int,
    q_len: int,
    capacity: int,
    ring_margin: int | None,
) -> torch.Tensor:  # [T, Hq, D]
    """Issue FIA as a named task group inside the graph being captured, and register it for updates.

    The kv lengths used here are placeholders (the largest possible): no host sync happens while
    capturing, and the runner re-issues the task with the real lengths before every replay.
    """
    torch_npu, npu = torch_npu_module(), npu_namespace()
    placeholder = [capacity] * batch
    workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(
        **call, actual_seq_lengths_kv=placeholder
    )
    tokens = call["query"]
    out = [torch.empty_like(tokens), torch.zeros(1, dtype=torch.float32, device=tokens.device)]
    stream = npu.current_stream()
    event = npu.ExternalEvent()
    event.wait(stream)  # captured: replay blocks here until the host has updated this task
    event.reset(stream)
    npu.graph_task_group_begin(stream)
    torch_npu.npu_fused_infer_attention_score.out(
        **call, actual_seq_lengths_kv=placeholder, workspace=workspace, out=out
    )
    handle = npu.graph_task_group_end(stream)
    record.attentions.append(
        CapturedAttention(handle, event, call, workspace, out, q_len, batch, capacity, ring_margin)
    )
    return out[0]


def _prefill_bnsd(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    meta: RaggedAttentionMetadata,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [B, Q, Hq, D] in the op dtype
    if active_capture() is not None:
        raise RuntimeError(
            f"ACLGraph capture covers verification steps of at most {MAX_QUERY_TOKENS_PER_REQUEST} "
            f"query tokens per request, got {query.shape[2]}"
        )
    mask = {"atten_mask": causal_mask(query.device), **band(window)}
    return _per_request_call(query, key, value, meta, scale, "BNSD_BSND", mask)


def _tree_bnsd(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    meta: RaggedAttentionMetadata,
    scale: float,
    window: int | None,
) -> torch.Tensor:  # [B, Q, Hq, D] in the op dtype
    """A token-tree step: BNSD with an explicit mask (``sparse_mode=0``, True where a query may not see a
    key: the complement of the reference's tree visibility, sliding window included). Trees run eagerly."""
    if active_capture() is not None:
        raise RuntimeError("token-tree steps run eagerly: ACLGraph capture covers chain verification only")
    hidden = ~ragged_causal_mask(meta, query.shape[2], key.shape[2], window)  # [B, 1, Q, L] bool
    mask = {"atten_mask": hidden.contiguous(), "sparse_mode": 0}
    return _per_request_call(query, key, value, meta, scale, "BNSD", mask).transpose(1, 2)


def _per_request_call(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    meta: RaggedAttentionMetadata,
    scale: float,
    layout: str,
    mask: dict[str, Any],  # atten_mask and its sparse mode / band
) -> torch.Tensor:  # the op's output in ``layout``'s output order, in the op dtype
    """One eager call over the dense cache with each request's query and kv lengths."""
    dtype = op_dtype(query.dtype)
    out, _ = torch_npu_module().npu_fused_infer_attention_score(
        query.to(dtype).contiguous(),
        key.to(dtype).contiguous(),
        value.to(dtype).contiguous(),
        actual_seq_lengths=[int(v) for v in meta.query_lens.tolist()],
        actual_seq_lengths_kv=[int(v) for v in meta.kv_lens.tolist()],
        num_heads=query.shape[1],
        num_key_value_heads=key.shape[1],
        scale=scale,
        input_layout=layout,
        **mask,
    )
    return out  # type: ignore[no-any-return]


def ascend_ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal ragged attention with FIA; returns ``[B, Q, Hq, D]`` in the query's dtype.

    ``attention_mask`` is ignored (the lengths in ``spec_attn_metadata`` define the mask, as in the
    reference, and the layer's ``sliding_window`` its band); ``dropout`` must be 0 (inference op).
    Padding query rows hold unspecified values.
    """
    meta = ragged_metadata(kwargs, module)
    del module, attention_mask
    if dropout:
        raise ValueError(
            f"npu_fused_infer_attention_score is inference-only: dropout must be 0, got {dropout}"
        )
    layer = layer_attention(kwargs)
    head_dim = query.shape[-1]
    if head_dim > MAX_HEAD_DIM or head_dim % HEAD_DIM_ALIGN or {key.shape[-1], value.shape[-1]} != {head_dim}:
        raise ValueError(
            f"npu_fused_infer_attention_score needs query/key/value head dims that are equal multiples of "
            f"{HEAD_DIM_ALIGN} up to {MAX_HEAD_DIM}, got query {head_dim}, key {key.shape[-1]}, "
            f"value {value.shape[-1]}"
        )
    if layer.explicit:
        raise ValueError(
            "npu_fused_infer_attention_score has no attention sinks and no logit soft cap, got "
            f"sinks={'yes' if layer.sinks is not None else 'no'}, softcap={layer.softcap}"
        )
    scale = float(scaling) if scaling is not None else head_dim**-0.5
    if meta.tree is not None:
        out = _tree_bnsd(query, key, value, meta, scale, layer.window)
    elif query.shape[2] > MAX_QUERY_TOKENS_PER_REQUEST:
        out = _prefill_bnsd(query, key, value, meta, scale, layer.window)
    elif head_dim in TND_HEAD_DIMS and layer.window is None:
        out = _decode_tnd(query, key, value, meta, scale)
    else:
        out = _decode_bnsd(query, key, value, meta, scale, layer.window)
    return out.to(query.dtype), None
