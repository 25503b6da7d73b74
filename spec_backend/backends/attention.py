"""Reference ragged attention for transformers' ``AttentionInterface``.

The engine runs one batched forward in which request ``b`` carries ``query_lens[b]`` new tokens
(K+1 while verifying, padded up to the batch's longest) and its KV cache holds ``kv_lens[b]`` tokens
*including* the new ones. Query ``i`` of request ``b`` sits at absolute position
``kv_lens[b] - query_lens[b] + i`` and sees every key at a position ``<=`` its own (causal within the
request's new tokens, full over its cached prefix). Padding query rows always see key 0 (at least),
so their softmax stays finite; their outputs are ignored by the engine.

A layer may ask for more through the keyword arguments transformers passes its attention function
(``LayerAttention``): a *sliding window* ``W`` (``sliding_window=``: query at position ``p`` sees only keys
at positions ``> p - W``, so ``W`` keys including its own; drafted positions of a verify step slide like
any other), *attention sinks* (``s_aux=``, GPT-OSS: one learned logit per head joins each row's softmax and
takes its share of the probability without contributing a value) and a *logit soft cap* (``softcap=``,
Gemma 2: scores pass through ``c * tanh(s / c)`` before the mask). Windows go into the mask; sinks and soft
caps take the explicit path (scores, softmax and the weighted sum written out in torch).

Glossary: *query tokens* — the tokens whose hidden states are computed this step; *kv length* — how
many cached positions of a request are valid after this step's keys were written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from spec_backend.step import RaggedAttentionMetadata

#: ``scaled_dot_product_attention(enable_gqa=...)`` exists from torch 2.5.
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def _version(t: torch.Tensor) -> int:
    """In-place modification counter; inference-mode tensors have none (-1)."""
    return -1 if t.is_inference() else int(t._version)


@dataclass(frozen=True)
class LayerAttention:
    """What one attention call asks for beyond causal attention (from transformers' keyword arguments).

    ``window``: the layer's sliding window ``W`` (``None``: full attention); ``sinks``: per-head sink
    logits ``[Hq]`` (``None``: no sinks); ``softcap``: the scores' soft cap (``None``: none).
    """

    window: int | None = None
    sinks: torch.Tensor | None = None
    softcap: float | None = None

    @property
    def explicit(self) -> bool:
        """Whether the scores need the explicit path (sinks or a soft cap; SDPA has neither)."""
        return self.sinks is not None or self.softcap is not None


def layer_attention(kwargs: dict[str, Any]) -> LayerAttention:
    """The ``LayerAttention`` of an attention call's keyword arguments; ``ValueError`` for a window or soft
    cap that is not a positive number."""
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window must be a positive int or None, got {window!r}")
    if softcap is not None and (
        isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap <= 0
    ):
        raise ValueError(f"softcap must be a positive number or None, got {softcap!r}")
    sinks = kwargs.get("s_aux")
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        raise ValueError(f"s_aux (attention sinks) must be a tensor [num_heads], got {type(sinks).__name__}")
    return LayerAttention(window, sinks, float(softcap) if softcap is not None else None)


#: What ``attention_needs`` reports: attention sinks, a logit soft cap, values of another head dim.
ATTENTION_NEEDS = ("sinks", "softcap", "latent")


def attention_needs(model: torch.nn.Module) -> frozenset[str]:
    """What ``model``'s attention layers ask of an attention function beyond (windowed) causal attention,
    read from its parameters and config before any forward, so a backend can refuse at load what it
    cannot compute: ``"sinks"`` (a parameter named ``sinks``, GPT-OSS), ``"softcap"`` (an attention
    module with ``attn_logit_softcapping`` set, Gemma 2) and ``"latent"`` (multi-head latent attention,
    ``kv_lora_rank``: values have their own head dim)."""
    needs = set()
    if any(name.rsplit(".", 1)[-1] == "sinks" for name, _ in model.named_parameters()):
        needs.add("sinks")
    if any(getattr(m, "attn_logit_softcapping", None) is not None for m in model.modules()):
        needs.add("softcap")
    config: Any = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "kv_lora_rank", None):
        needs.add("latent")
    return frozenset(needs)


def ragged_causal_mask(
    meta: RaggedAttentionMetadata, q_len: int, kv_len: int, window: int | None = None
) -> torch.Tensor:
    """Boolean mask ``[B, 1, q_len, kv_len]``: True where a query may attend a key (only the last
    ``window`` positions up to its own where a window is given).

    Every decoder layer of one forward asks for the same mask (one per window size): it is built once per
    step and reused. The key includes the version counters of ``query_lens`` / ``kv_lens`` where they
    exist, so a metadata object whose tensors are updated in place never gets a stale mask (see
    ``invalidate``).
    """
    key = (q_len, kv_len, _version(meta.query_lens), _version(meta.kv_lens), window or 0)
    mask = meta.mask_cache.get(key)
    if mask is None:
        mask = meta.mask_cache[key] = _build_mask(meta, q_len, kv_len, window)
    return mask


def _build_mask(meta: RaggedAttentionMetadata, q_len: int, kv_len: int, window: int | None) -> torch.Tensor:
    device = meta.query_lens.device
    q_idx = torch.arange(q_len, device=device)  # [Q]
    k_idx = torch.arange(kv_len, device=device)  # [L]
    q_pos = (meta.kv_lens - meta.query_lens).unsqueeze(1) + q_idx  # [B, Q] absolute positions
    if meta.tree is None and window is None:
        # a query sees keys 0 .. its position, a padding query (position >= kv_len) every valid key, and
        # a row without keys key 0 (a softmax over no key is NaN): the last key seen, clamped into range
        last = torch.minimum(q_pos, (meta.kv_lens - 1).unsqueeze(1)).clamp_min_(0)  # [B, Q]
        return (k_idx <= last.unsqueeze(2)).unsqueeze(1)  # [B, 1, Q, L]
    if meta.tree is not None:
        mask, q_pos, k_pos = _tree_visibility(meta, q_len, k_idx)  # [B, Q, L], [B, Q], [B, L]
    else:
        mask, k_pos = k_idx[None, None, :] <= q_pos[:, :, None], k_idx[None, :]  # [B, Q, L], [1, L]
    if window is not None:
        mask &= k_pos[:, None, :] > q_pos[:, :, None] - window
    mask &= k_idx[None, None, :] < meta.kv_lens[:, None, None]
    padding = q_idx[None, :] >= meta.query_lens[:, None]  # [B, Q]
    mask |= padding[:, :, None] & (k_idx[None, None, :] == 0)
    return mask[:, None]


def _tree_visibility(
    meta: RaggedAttentionMetadata, q_len: int, k_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tree step's visibility ``[B, Q, L]`` (the cached prefix, then this step's keys by ancestry) and
    the queries' and keys' positions ``[B, Q]`` / ``[B, L]`` (this step's at ``first + depth``)."""
    assert meta.tree is not None and meta.tree_depths is not None
    first = meta.kv_lens - meta.query_lens  # [B]
    col = k_idx[None, :] - first[:, None]  # [B, L] the step's column of each key (< 0: cached)
    new = col >= 0
    index = col.clamp(0, q_len - 1)  # [B, L]
    seen = torch.gather(meta.tree[:, :q_len, :q_len], 2, index[:, None, :].expand(-1, q_len, -1))  # [B, Q, L]
    mask = torch.where(new[:, None, :], seen, True)
    depth_of_key = torch.gather(meta.tree_depths[:, :q_len], 1, index)  # [B, L]
    k_pos = torch.where(new, first[:, None] + depth_of_key, k_idx[None, :])
    return mask, first[:, None] + meta.tree_depths[:, :q_len], k_pos


def ragged_metadata(kwargs: dict[str, Any], module: Any = None) -> RaggedAttentionMetadata:
    """The step's ``spec_attn_metadata`` from an attention call's keyword arguments (a clear error when a
    forward was called without it), as attention module ``module`` sees its keys
    (``RaggedAttentionMetadata.for_layer``)."""
    meta = kwargs.get("spec_attn_metadata")
    if not isinstance(meta, RaggedAttentionMetadata):
        raise ValueError(
            "spec_backend attention needs spec_attn_metadata=RaggedAttentionMetadata(...) in the forward "
            f"kwargs, got {type(meta).__name__}"
        )
    return meta.for_layer(module)


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


def explicit_attention(
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, Dv]
    mask: torch.Tensor,  # [B, 1, Q, L] bool
    scale: float,
    layer: LayerAttention,
) -> torch.Tensor:  # [B, Hq, Q, Dv]
    """Attention written out: scores, the soft cap, the mask, the softmax (float32, with the sink logit of
    each head as one more column, dropped after it) and the weighted sum of the values."""
    n_rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(n_rep, dim=1), value.repeat_interleave(n_rep, dim=1)
    scores = (query @ key.transpose(-1, -2)).float() * scale  # [B, Hq, Q, L]
    if layer.softcap is not None:
        scores = torch.tanh(scores / layer.softcap) * layer.softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if layer.sinks is not None:
        sink = layer.sinks.float().reshape(1, -1, 1, 1).expand(*scores.shape[:3], 1)  # [B, Hq, Q, 1]
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # [B, Hq, Q, L]
    else:
        probs = torch.softmax(scores, dim=-1)
    return probs.to(value.dtype) @ value


def sdpa_ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, L, D]
    value: torch.Tensor,  # [B, Hkv, L, Dv]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA with an explicit ragged causal mask (windowed where the layer has a sliding window), or the
    explicit path for sinks and soft caps; returns ``[B, Q, Hq, Dv]`` as transformers expects."""
    meta, layer = ragged_metadata(kwargs, module), layer_attention(kwargs)
    del module, attention_mask, dropout  # the lengths define the mask; inference only
    mask = ragged_causal_mask(meta, query.shape[2], key.shape[2], layer.window)  # [B, 1, Q, L]
    if layer.explicit:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = explicit_attention(query, key, value, mask, scale, layer)  # [B, Hq, Q, Dv]
        return out.transpose(1, 2).contiguous(), None
    key, value, gqa = grouped_kv(query, key, value)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, **gqa
    )  # [B, Hq, Q, Dv]
    return out.transpose(1, 2).contiguous(), None
