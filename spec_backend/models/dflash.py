"""DFlash block drafter (``method="dflash"``), from z-lab's published checkpoint format.

Format (``z-lab/*-DFlash-*``): ``config.json`` is a Qwen3Config of the draft layers plus ``block_size``,
``num_target_layers`` and ``dflash_config: {mask_token_id, target_layer_ids}``
(``architectures: ["DFlashDraftModel"]``); weights ``fc.weight [H, n·Ht]``, ``hidden_norm.weight``,
``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.{q,k}_norm.weight``,
``layers.{i}.{input,post_attention}_layernorm.weight``, ``layers.{i}.mlp.*``, ``norm.weight``; no embedding
and no LM head (the target's are used).

Glossary: *context* — the committed tokens' target features ``hidden_norm(fc(cat(feats)))``, one row per
token at its own position; every layer projects them to keys/values (after ``k_norm`` and RoPE), which
are the only thing the draft cache keeps. *Block* — ``[last committed token, MASK × K]`` at the positions
that follow; it runs through the layers as queries attending to the whole cached context and to the
whole block (not causal inside the block). ``target_layer_ids`` name layer *outputs*, so the target's
residual stream entering layer ``id + 1`` (our aux id) is read; the default is z-lab's
``build_target_layer_ids``.

One forward drafts all K tokens: the outputs of block rows ``1..K`` go through ``norm`` and the
target's LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from spec_backend.models.checkpoint import check_tensors, module_shapes, read_config, read_tensors
from spec_backend.models.draft_vocab import target_ids, to_target_logits


@dataclass(frozen=True)
class DFlashSpec:
    """What a z-lab DFlash ``config.json`` says."""

    block_size: int
    mask_token_id: int
    aux_layer_ids: tuple[int, ...]  # residual streams entering these target layers (z-lab's ids + 1)
    draft_vocab_size: int | None = None  # speculators: a reduced vocabulary (d2t)


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default: the middle layer for one draft layer, else evenly from 1 to L - 3 (rounded)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # x [B, h, T, d]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class DFlashHead(torch.nn.Module):
    """The DFlash draft model (see the module docstring). ``embed``/``lm_head``: the target's."""

    def __init__(self, config: Any, num_features: int, embed: Any, lm_head: Any) -> None:
        from transformers.models.qwen3.modeling_qwen3 import (
            Qwen3DecoderLayer,
            Qwen3RMSNorm,
            Qwen3RotaryEmbedding,
        )

        super().__init__()
        h, eps = int(config.hidden_size), float(config.rms_norm_eps)
        self.config = config
        self.fc = torch.nn.Linear(num_features * h, h, bias=False)
        self.hidden_norm = Qwen3RMSNorm(h, eps=eps)
        self.layers = torch.nn.ModuleList(
            [Qwen3DecoderLayer(config, i) for i in range(int(config.num_hidden_layers))]
        )
        self.norm = Qwen3RMSNorm(h, eps=eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.target: tuple[Any, Any] = (embed, lm_head)  # the target's or the checkpoint's; not parameters
        self.vocab: tuple[int, torch.Tensor | None] = (int(config.vocab_size), None)  # V, draft -> target ids
        self.head_dim = int(config.head_dim)

    def _kv(
        self, attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, t = x.shape[:2]  # x [B, T, H] -> keys/values [B, kv_heads, T, d]
        k = attn.k_norm(attn.k_proj(x).view(b, t, -1, self.head_dim)).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        return _rope(k, cos, sin), v

    def forward(
        self,
        features: torch.Tensor,  # [B, C, n·Ht] this step's context rows (padded)
        context_positions: torch.Tensor,  # [B, C]
        block_ids: torch.Tensor,  # [B, Q] = [last committed, MASK × K]
        block_positions: torch.Tensor,  # [B, Q]
        cache: Any,
        context_lens: torch.Tensor,  # [B] cached context rows after this step's rows are written
    ) -> torch.Tensor:  # [B, Q, V] float logits of every block row
        ctx = self.hidden_norm(self.fc(features))  # [B, C, H]
        x = self.target[0](block_ids).to(ctx.dtype)  # [B, Q, H]
        cos_c, sin_c = self.rotary_emb(ctx, context_positions)  # [B, C, d]
        cos_q, sin_q = self.rotary_emb(x, block_positions)  # [B, Q, d]
        b, q_len = block_ids.shape
        layers: list[Any] = list(self.layers)
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            k_ctx, v_ctx = cache.update(*self._kv(attn, ctx, cos_c, sin_c), i)  # [B, kv, L, d]
            h = layer.input_layernorm(x)  # [B, Q, H]
            q = _rope(
                attn.q_norm(attn.q_proj(h).view(b, q_len, -1, self.head_dim)).transpose(1, 2), cos_q, sin_q
            )
            k_blk, v_blk = self._kv(attn, h, cos_q, sin_q)
            keys, values = (
                torch.cat([k_ctx, k_blk], dim=2),
                torch.cat([v_ctx, v_blk], dim=2),
            )  # [B, kv, L+Q, d]
            cached = torch.arange(k_ctx.shape[2], device=x.device)[None] < context_lens[:, None]  # [B, L]
            mask = torch.cat([cached, cached.new_ones(b, q_len)], dim=1)[:, None, None]  # [B, 1, 1, L+Q]
            out = torch.nn.functional.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=self.head_dim**-0.5, enable_gqa=True
            )  # [B, heads, Q, d]
            x = x + attn.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        draft: torch.Tensor = self.target[1](self.norm(x)).float()  # [B, Q, Vd]
        return to_target_logits(draft, self.vocab[1], self.vocab[0])  # [B, Q, V]


def _zlab_fields(path: str, raw: dict[str, Any], num_target_layers: int) -> tuple[dict[str, Any], DFlashSpec]:
    dflash = raw.get("dflash_config")
    if not isinstance(dflash, dict) or not isinstance(dflash.get("mask_token_id"), int):
        raise ValueError(
            f"DFlash checkpoint {path!r} needs dflash_config.mask_token_id (an int), got {dflash!r}"
        )
    ids = dflash.get("target_layer_ids") or default_target_layer_ids(
        num_target_layers, int(raw.get("num_hidden_layers", 1))
    )
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < num_target_layers]
    if bad:
        raise ValueError(
            f"DFlash checkpoint {path!r}: target_layer_ids {list(ids)} must be layer ids in "
            f"0..{num_target_layers - 1} (the target has {num_target_layers} layers)"
        )
    block_raw: Any = raw.get("block_size") or dflash.get("block_size") or 16
    spec = DFlashSpec(int(block_raw), int(dflash["mask_token_id"]), tuple(int(i) + 1 for i in ids))
    return raw, spec


def _speculators_fields(
    path: str, raw: dict[str, Any], num_target_layers: int
) -> tuple[dict[str, Any], DFlashSpec]:
    if raw["speculators_model_type"] != "dflash":
        raise ValueError(
            f"DFlash checkpoint {path!r} has speculators_model_type={raw['speculators_model_type']!r}"
        )
    if raw.get("sample_from_anchor"):
        raise ValueError(f"DFlash checkpoint {path!r}: sample_from_anchor=true heads are not supported")
    if not isinstance(raw.get("mask_token_id"), int):
        raise ValueError(
            f"DFlash checkpoint {path!r} needs mask_token_id (an int), got {raw.get('mask_token_id')!r}"
        )
    layers = num_target_layers
    ids = raw.get("aux_hidden_state_layer_ids") or [2, layers // 2, layers - 3]
    if any(not isinstance(i, int) or not 0 <= i <= layers for i in ids):
        raise ValueError(
            f"DFlash checkpoint {path!r}: aux_hidden_state_layer_ids {list(ids)} must be layer ids in "
            f"0..{layers} (the target has {layers} layers)"
        )
    vocab_raw: Any = raw.get("draft_vocab_size")
    spec = DFlashSpec(int(raw.get("block_size") or 8), raw["mask_token_id"], tuple(ids), vocab_raw)
    return dict(raw["transformer_layer_config"]), spec


def parse_dflash_config(path: str, raw: dict[str, Any], num_target_layers: int) -> tuple[Any, DFlashSpec]:
    """The draft layers' Qwen3Config and the DFlash fields of a z-lab or speculators ``config.json``."""
    from transformers import Qwen3Config

    if raw.get("speculators_model_type") is not None:
        layer, spec = _speculators_fields(path, raw, num_target_layers)
    else:
        layer, spec = _zlab_fields(path, raw, num_target_layers)
    skip = ("architectures", "dflash_config", "block_size", "num_target_layers", "model_type", "auto_map")
    return Qwen3Config(**{k: v for k, v in layer.items() if k not in skip}), spec


def _own_vocab(
    path: str, tensors: dict[str, torch.Tensor], spec: DFlashSpec, vocab: int, hidden: int
) -> tuple[Any, Any, torch.Tensor | None]:
    """The checkpoint's own embedding and LM head (speculators format) and its draft-vocabulary map."""
    embed = tensors.pop("embed_tokens.weight", None)  # [V, H]
    head = tensors.pop("lm_head.weight", None)  # [Vd, H]
    d2t, t2d = tensors.pop("d2t", None), tensors.pop("t2d", None)
    vd = spec.draft_vocab_size or vocab
    wrong = [
        f"{name}: {list(t.shape)} (expected {list(shape)})"
        for name, t, shape in (
            ("embed_tokens.weight", embed, (vocab, hidden)),
            ("lm_head.weight", head, (vd, hidden)),
        )
        if t is not None and tuple(t.shape) != shape
    ]
    if wrong or (vd != vocab and (d2t is None or head is None)):
        raise ValueError(
            f"DFlash checkpoint {path!r}: {wrong or f'draft_vocab_size {vd} < {vocab} needs lm_head and d2t'}"
        )
    own_embed = torch.nn.Embedding(vocab, hidden, _weight=embed, _freeze=True) if embed is not None else None
    own_head = torch.nn.Linear(hidden, vd, bias=False) if head is not None else None
    if own_head is not None and head is not None:
        own_head.weight = torch.nn.Parameter(head, requires_grad=False)
    ids = target_ids("DFlash", path, d2t, t2d, vocab) if d2t is not None else None
    return own_embed, own_head, ids


def load_dflash_head(
    path: str, target: Any, attn_name: str, dtype: torch.dtype
) -> tuple[DFlashHead, DFlashSpec]:
    """Load a z-lab or speculators DFlash folder for ``target`` (sizes, mask token, every tensor checked)."""
    raw = read_config("DFlash", path)
    text = target.config.get_text_config()
    config, spec = parse_dflash_config(path, raw, int(text.num_hidden_layers))
    config._attn_implementation = attn_name
    target_embed = target.get_input_embeddings()
    vocab, ht = int(target_embed.weight.shape[0]), int(target_embed.weight.shape[1])
    if int(config.hidden_size) != ht or not 0 <= spec.mask_token_id < vocab:
        raise ValueError(
            f"DFlash checkpoint {path!r} (hidden_size {config.hidden_size}, mask_token_id "
            f"{spec.mask_token_id}) does not fit the target (hidden size {ht}, vocabulary {vocab})"
        )
    tensors = read_tensors("DFlash", path, lambda n: None if n.startswith("verifier_") else n)
    embed, lm_head, ids = _own_vocab(path, tensors, spec, vocab, ht)
    head = DFlashHead(
        config,
        len(spec.aux_layer_ids),
        embed if embed is not None else target_embed,
        lm_head if lm_head is not None else target.get_output_embeddings(),
    )
    check_tensors("DFlash", path, module_shapes(head), tensors)
    head.load_state_dict(tensors)
    device = next(target.parameters()).device
    head.target = (
        head.target[0].to(device=device, dtype=dtype),
        head.target[1].to(device=device, dtype=dtype),
    )
    head.vocab = (vocab, None if ids is None else ids.to(device))
    return head.to(device=device, dtype=dtype).eval(), spec


__all__ = ["DFlashHead", "DFlashSpec", "default_target_layer_ids", "load_dflash_head", "parse_dflash_config"]
