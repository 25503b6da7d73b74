"""Ragged attention on CUDA for transformers' ``AttentionInterface``: flash-attn, else SDPA; or triton.

Contract (the reference, ``spec_backend.backends.attention``): request ``b`` carries
``query_lens[b]`` real query rows, right-padded to ``Q``; its cache view holds ``kv_lens[b]`` valid keys
*including* this step's; real query ``i`` sits at position ``kv_lens[b] - query_lens[b] + i`` and sees
every key up to it. Outputs of padding rows are unspecified but finite (the engine ignores them).

Paths (:func:`cuda_ragged_attention` picks one per call from shapes and dtypes, never from values, so
it never synchronises with the host and can be captured in a CUDA graph):

* **flash** — ``flash_attn.flash_attn_with_kvcache`` over the engine's cache views with per-request
  ``cache_seqlens = kv_lens``. Its causal mask is aligned bottom-right (query ``j`` of ``Q`` sees keys
  ``< cache_seqlens - Q + j + 1``), which matches the contract only for *left*-padded queries, so
  each request's rows are rotated by ``Q - query_lens[b]`` before the call (real rows last) and
  rotated back after it: two gathers of ``[B, Q, Hq, D]``, no copy of the cache. Padding rows that
  see no key come back as zeros. A layer's sliding window ``W`` is flash-attn's local attention,
  ``window_size=(W - 1, 0)`` (flash-attn README: query ``i`` attends keys in ``[i + seqlen_k - seqlen_q -
  window_size[0], i + seqlen_k - seqlen_q + window_size[1]]``, bottom-right aligned like its causal mask,
  so drafted rows of a verify step slide too). Used when ``flash_attn`` is importable, the GPU is Ampere
  (compute capability 8.0) or newer, the tensors are on CUDA in float16/bfloat16, the head dim is a
  multiple of 8 up to 256 and the values' head dim equals it (not latent attention), there is no dropout,
  and the layer has no attention sinks or soft cap (those take the SDPA path).
* **sdpa** — the reference (:func:`spec_backend.backends.attention.sdpa_ragged_attention`, its
  explicit boolean mask from ``ragged_causal_mask``): every dtype and device. One thing is added for
  CUDA graphs (:func:`cuda_sdpa_attention`): the reference caches each step's mask on the metadata, and a
  mask built eagerly (the warm-up before a capture) would be frozen into the graph as a constant, so a
  replay with new lengths would read the old mask. While a graph is captured, masks built outside that
  capture are dropped and rebuilt inside it (recorded once, shared by every layer); outside a capture,
  masks built inside one (they hold values only after a replay) are dropped.
* **triton** (chosen by name, ``CudaBackend(attention="triton")``; not yet by ``auto``, which waits for a
  GPU measurement against SDPA) — one kernel that reads only each request's valid keys
  (``spec_backend_cuda.triton_attention``): every dtype of the engine, windows, soft caps, sinks, values
  of another head dim. Token trees take the SDPA path.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import weakref
from collections.abc import Callable
from typing import Any

import torch

from spec_backend.backends.attention import (
    LayerAttention,
    layer_attention,
    ragged_metadata,
    sdpa_ragged_attention,
)
from spec_backend.step import RaggedAttentionMetadata
from spec_backend_cuda.limits import FLASH_MIN_CAPABILITY

#: ``flash_attn_with_kvcache``-compatible kernel: (q [B,Q,Hq,D], k [B,L,Hkv,D], v, **kw) -> [B,Q,Hq,D].
FlashKernel = Callable[..., torch.Tensor]

#: flash-attn computes in float16 / bfloat16 (flash-attention README: "Datatype fp16 and bf16").
FLASH_DTYPES = (torch.float16, torch.bfloat16)
#: flash-attention README: "All head dimensions up to 256"; head dims are multiples of 8 (its kernels
#: round the head dim up to 32/64/96/128/192/256 templates and check `head_size % 8 == 0`).
FLASH_MAX_HEAD_DIM = 256


@functools.lru_cache(maxsize=1)
def flash_attn_installed() -> bool:
    """Whether the ``flash_attn`` package can be found (not imported: that loads its CUDA extension)."""
    return importlib.util.find_spec("flash_attn") is not None


def load_flash_kernel() -> FlashKernel:
    """``flash_attn.flash_attn_with_kvcache``; ``ImportError`` with the install hint when missing."""
    try:
        module = importlib.import_module("flash_attn")  # no stubs: typed through FlashKernel
    except ImportError as exc:
        raise ImportError(
            "the flash attention path needs flash-attn (pip install 'spec-backend-cuda[flash]'): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    kernel: FlashKernel = module.flash_attn_with_kvcache
    return kernel


@functools.lru_cache(maxsize=16)
def device_capability(index: int) -> tuple[int, int]:
    """Compute capability of CUDA device ``index`` (a host query, cached: never a device sync)."""
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


def flash_capability_reason(capability: tuple[int, int]) -> str | None:
    """Why flash-attn cannot run on a GPU of this compute capability (``None``: it can)."""
    if capability >= FLASH_MIN_CAPABILITY:
        return None
    need = ".".join(map(str, FLASH_MIN_CAPABILITY))
    return f"compute capability {capability[0]}.{capability[1]} (flash-attn needs {need}, Ampere, or newer)"


def flash_unsupported_reason(
    query: torch.Tensor,
    key: torch.Tensor,
    dropout: float = 0.0,
    value: torch.Tensor | None = None,
    layer: LayerAttention | None = None,
) -> str | None:
    """Why the flash path cannot run these tensors (``None``: it can). Shapes, dtypes, the GPU and what
    the layer asks for (``LayerAttention``) only, never values."""
    head_dim = query.shape[-1]
    if not flash_attn_installed():
        return "flash_attn is not installed"
    if query.device.type != "cuda":
        return f"tensors are on {query.device.type}, not cuda"
    too_old = flash_capability_reason(device_capability(query.device.index or 0))
    if too_old is not None:
        return too_old
    if query.dtype not in FLASH_DTYPES or key.dtype != query.dtype:
        return f"dtype {query.dtype} (flash-attn computes in float16/bfloat16 only)"
    if head_dim % 8 or head_dim > FLASH_MAX_HEAD_DIM:
        return f"head dim {head_dim} (flash-attn needs a multiple of 8 up to {FLASH_MAX_HEAD_DIM})"
    if dropout:
        return "dropout > 0"
    return flash_layer_reason(head_dim, value, layer)


def flash_layer_reason(
    head_dim: int, value: torch.Tensor | None = None, layer: LayerAttention | None = None
) -> str | None:
    """Why flash-attn's kernel cannot compute this layer (``None``: it can): values of another head dim
    (latent attention), attention sinks, a logit soft cap. A sliding window it computes."""
    if value is not None and value.shape[-1] != head_dim:
        return f"value head dim {value.shape[-1]} differs from the query's {head_dim}"
    if layer is not None and layer.sinks is not None:
        return "the layer has attention sinks"
    if layer is not None and layer.softcap is not None:
        return "the layer has a logit soft cap"
    return None


def rotation_index(query_lens: torch.Tensor, q_len: int, to_left: bool) -> torch.Tensor:
    """Per-request row permutation ``[B, Q]`` between right-padded and left-padded query layouts.

    ``to_left``: row ``j`` of the left-padded layout takes row ``(j + q_b - Q) mod Q`` of the
    right-padded one (real rows end up last); otherwise the inverse, ``(i + Q - q_b) mod Q``.
    """
    rows = torch.arange(q_len, device=query_lens.device)[None, :]  # [1, Q]
    shift = (q_len - query_lens.to(torch.int64))[:, None]  # [B, 1] padding rows per request
    return torch.remainder(rows - shift if to_left else rows + shift, q_len)  # [B, Q]


def ragged_flash(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    meta: RaggedAttentionMetadata,
    scale: float,
    kernel: FlashKernel,
    window: int | None = None,
) -> torch.Tensor:  # [B, Q, Hq, D]
    """The flash path (see the module docstring); ``kernel`` has ``flash_attn_with_kvcache``'s API;
    ``window``: the layer's sliding window (``None``: full causal attention)."""
    batch, _, q_len, _ = query.shape
    batch_idx = torch.arange(batch, device=query.device)[:, None]  # [B, 1]
    q = query.transpose(1, 2)  # [B, Q, Hq, D]
    q_left = q[batch_idx, rotation_index(meta.query_lens, q_len, to_left=True)]  # [B, Q, Hq, D]
    k_cache = key.transpose(1, 2)  # [B, L, Hkv, D] view of the cache, unit stride on D
    v_cache = value.transpose(1, 2)  # [B, L, Hkv, D]
    if k_cache.stride(-1) != 1:
        k_cache = k_cache.contiguous()
    if v_cache.stride(-1) != 1:
        v_cache = v_cache.contiguous()
    local = {"window_size": (window - 1, 0)} if window is not None else {}  # W keys: W - 1 before, itself
    out = kernel(
        q_left,
        k_cache,
        v_cache,
        cache_seqlens=meta.kv_lens.to(torch.int32),
        softmax_scale=scale,
        causal=True,
        **local,
    )  # [B, Q, Hq, D], left-padded rows
    return out[batch_idx, rotation_index(meta.query_lens, q_len, to_left=False)]  # [B, Q, Hq, D]


def flash_ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The flash path as an ``AttentionInterface`` function; returns ``[B, Q, Hq, D]``."""
    meta, layer = ragged_metadata(kwargs, module), layer_attention(kwargs)
    reason = flash_unsupported_reason(query, key, dropout, value, layer)
    if meta.tree is not None:
        reason = (
            "a token tree's ancestor mask (flash attention masks causally only; the SDPA path serves trees)"
        )
    if reason is not None:
        raise ValueError(f"the flash attention path cannot run here: {reason}")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return ragged_flash(query, key, value, meta, scale, load_flash_kernel(), layer.window), None


#: the masks built during the current capture, by id (weak references: a freed mask's id can be
#: reused by an eager one, which must not pass for a graph's); reset per capture
_GRAPH_MASKS: dict[int, weakref.ref[torch.Tensor]] = {}


def _in_graph(mask: torch.Tensor) -> bool:
    ref = _GRAPH_MASKS.get(id(mask))
    return ref is not None and ref() is mask


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False where torch has no CUDA)."""
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def begin_capture() -> None:
    """Called by the graph driver before each capture: no mask of an earlier capture is reused in it."""
    _GRAPH_MASKS.clear()


def cuda_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The reference SDPA path with its mask cache kept on the right side of graph captures."""
    meta = ragged_metadata(kwargs, module)
    inside = capturing()
    for cached, mask in list(meta.mask_cache.items()):
        if _in_graph(mask) != inside:  # built on the other side of a capture boundary
            del meta.mask_cache[cached]
    out = sdpa_ragged_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    if inside:
        _GRAPH_MASKS.update((id(mask), weakref.ref(mask)) for mask in meta.mask_cache.values())
    return out


def cuda_ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The CUDA backend's attention: flash when it can run these tensors, else (and for token trees,
    whose ancestor masks flash cannot apply) the reference SDPA."""
    tree = ragged_metadata(kwargs, module).tree is not None
    if not tree and flash_unsupported_reason(query, key, dropout, value, layer_attention(kwargs)) is None:
        return flash_ragged_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    return cuda_sdpa_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)


def triton_chain_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, Dv]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The triton path: the triton kernel for chain steps (a call it cannot compute is refused by name),
    the reference SDPA for a token tree's ancestor mask, as ``auto`` routes trees."""
    from spec_backend_cuda.triton_attention import triton_ragged_attention

    if ragged_metadata(kwargs, module).tree is not None:
        return cuda_sdpa_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    return triton_ragged_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)


#: The attention functions by path name (``CudaBackend(attention=...)``).
ATTENTION_PATHS: dict[str, Callable[..., tuple[torch.Tensor, None]]] = {
    "auto": cuda_ragged_attention,
    "flash": flash_ragged_attention,
    "sdpa": cuda_sdpa_attention,
    "triton": triton_chain_attention,
}

__all__ = [
    "ATTENTION_PATHS",
    "FlashKernel",
    "begin_capture",
    "cuda_ragged_attention",
    "cuda_sdpa_attention",
    "device_capability",
    "flash_attn_installed",
    "flash_capability_reason",
    "flash_layer_reason",
    "flash_ragged_attention",
    "flash_unsupported_reason",
    "load_flash_kernel",
    "ragged_flash",
    "rotation_index",
    "triton_chain_attention",
]
