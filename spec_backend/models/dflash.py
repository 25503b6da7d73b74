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
from spec_backend.models.dflash2 import DFlash2Spec, add_dflash2_modules, parse_dflash2
from spec_backend.models.draft_vocab import target_ids, to_target_logits


@dataclass(frozen=True)
class DFlashSpec:
    """What a z-lab DFlash ``config.json`` says."""

    block_size: int
    mask_token_id: int
    aux_layer_ids: tuple[int, ...]  # residual streams entering these target layers (z-lab's ids + 1)
    draft_vocab_size: int | None = None  # speculators: a reduced vocabulary (d2t)
    v2: DFlash2Spec | None = None  # z-lab's DFlash2 additions (convolutions, candidate selector)
    output_multiplier: float = 1.0  # logits scale (z-lab's compute_logits)
    softcap: float | None = None  # final_logit_softcapping: tanh(l / c) * c
    embedding_scale: float = 1.0  # input_embedding_scale of the block's token embeddings


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
        self.rules = [_attention_rule(config, i) for i in range(len(self.layers))]
        self.spec: DFlashSpec | None = None  # set by the loader (logit scale, softcap, embedding scale)
        self.candidate_selector: Any = None  # DFlash2

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
    ) -> torch.Tensor:  # [B, Q, H] the block rows' normalised outputs (``logits`` turns them into logits)
        ctx = self.hidden_norm(self.fc(features))  # [B, C, H]
        scale = self.spec.embedding_scale if self.spec is not None else 1.0
        x = self.target[0](block_ids).to(ctx.dtype) * scale  # [B, Q, H]
        rope_c = self.rotary_emb(ctx, context_positions)  # cos, sin [B, C, d]
        rope_q = self.rotary_emb(x, block_positions)  # cos, sin [B, Q, d]
        masks: dict[tuple[bool, int | None], torch.Tensor] = {}  # one per distinct layer rule
        for i, layer in enumerate(self.layers):
            k_ctx, v_ctx = cache.update(*self._kv(layer.self_attn, ctx, *rope_c), i)  # [B, kv, L, d]
            rule = self.rules[i]
            if rule not in masks:
                masks[rule] = _mask(rule, context_lens, k_ctx.shape[2], block_positions)  # [B, 1, Q, L+Q]
            x = self._layer(layer, x, k_ctx, v_ctx, rope_q, masks[rule])
        out: torch.Tensor = self.norm(x)
        return out

    def _layer(
        self,
        layer: Any,
        x: torch.Tensor,  # [B, Q, H]
        k_ctx: torch.Tensor,  # [B, kv, L, d]
        v_ctx: torch.Tensor,
        rope_q: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,  # [B, 1, Q, L+Q] bool
    ) -> torch.Tensor:  # [B, Q, H]
        attn, (b, q_len) = layer.self_attn, x.shape[:2]
        conv_a, conv_m = getattr(layer, "attention_conv", None), getattr(layer, "mlp_conv", None)
        h = layer.input_layernorm(x)  # [B, Q, H]
        h, kernel = conv_a.prepare(h) if conv_a is not None else (h, None)
        q = _rope(attn.q_norm(attn.q_proj(h).view(b, q_len, -1, self.head_dim)).transpose(1, 2), *rope_q)
        k_blk, v_blk = self._kv(attn, h, *rope_q)
        keys, values = torch.cat([k_ctx, k_blk], dim=2), torch.cat([v_ctx, v_blk], dim=2)  # [B, kv, L+Q, d]
        out = torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=self.head_dim**-0.5, enable_gqa=True
        )  # [B, heads, Q, d]
        out = attn.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))  # [B, Q, H]
        x = x + (conv_a.finish(out, kernel) if conv_a is not None else out)
        h = layer.post_attention_layernorm(x)
        h, kernel = conv_m.prepare(h) if conv_m is not None else (h, None)
        out = layer.mlp(h)
        result: torch.Tensor = x + (conv_m.finish(out, kernel) if conv_m is not None else out)
        return result

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., Vd] float
        """The target's (or the checkpoint's) LM head with z-lab's scale and softcap, over the draft
        vocabulary."""
        draft: torch.Tensor = self.target[1](hidden).float()  # [..., Vd]
        if self.spec is not None and self.spec.output_multiplier != 1.0:
            draft = draft * self.spec.output_multiplier
        if self.spec is not None and self.spec.softcap:
            draft = torch.tanh(draft / self.spec.softcap) * self.spec.softcap
        return draft

    def to_target(self, draft: torch.Tensor) -> torch.Tensor:  # [..., Vd] -> [..., V]
        """Draft-vocabulary logits placed at their target ids (``-inf`` outside the draft vocabulary)."""
        return to_target_logits(draft, self.vocab[1], self.vocab[0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V] float
        """``draft_logits`` over the target's vocabulary."""
        return self.to_target(self.draft_logits(hidden))


def _attention_rule(config: Any, index: int) -> tuple[bool, int | None]:
    """(causal inside the block, sliding window) of draft layer ``index``, as z-lab decides them: a
    ``sliding_attention`` layer has the config's window and is causal unless ``is_causal`` says."""
    types = getattr(config, "layer_types", None)
    kind = types[index] if types else "full_attention"
    declared = getattr(config, "is_causal", None)
    causal = kind == "sliding_attention" if declared is None else bool(declared)
    window = getattr(config, "sliding_window", None) if kind == "sliding_attention" else None
    return causal, int(window) if window else None


def _mask(
    rule: tuple[bool, int | None],
    context_lens: torch.Tensor,  # [B] valid cached context rows (row j holds position j)
    cached: int,  # L, the width of the cache view
    block_positions: torch.Tensor,  # [B, Q]
) -> torch.Tensor:  # [B, 1, Q, L+Q] bool, True = visible
    causal, window = rule
    b = block_positions.shape[0]
    key_pos = torch.cat(
        [torch.arange(cached, device=block_positions.device)[None].expand(b, -1), block_positions], dim=1
    )  # [B, L+Q]
    valid = torch.cat(
        [key_pos[:, :cached] < context_lens[:, None], torch.ones_like(block_positions, dtype=torch.bool)], 1
    )  # [B, L+Q]
    query_pos = block_positions[:, :, None]  # [B, Q, 1]
    visible = valid[:, None, :].expand(-1, block_positions.shape[1], -1)  # [B, Q, L+Q]
    if causal:
        visible = visible & (key_pos[:, None, :] <= query_pos)
    if window is not None:
        visible = visible & (query_pos - key_pos[:, None, :] < window)
        if not causal:
            visible = visible & (key_pos[:, None, :] - query_pos < window)
    return visible[:, None]


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

    def value(name: str, default: Any) -> Any:  # z-lab reads dflash_config first, then the config
        found = dflash.get(name, raw.get(name, default))
        if found is not None and (isinstance(found, bool) or not isinstance(found, int | float)):
            raise ValueError(f"DFlash checkpoint {path!r}: {name} must be a number, got {found!r}")
        return default if found is None else found

    spec = DFlashSpec(
        int(block_raw),
        int(dflash["mask_token_id"]),
        tuple(int(i) + 1 for i in ids),
        v2=parse_dflash2(path, dflash, int(raw.get("hidden_size", 0)), int(raw.get("vocab_size", 0))),
        output_multiplier=float(value("output_multiplier", 1.0)),
        softcap=float(value("final_logit_softcapping", 0.0)) or None,
        embedding_scale=float(value("input_embedding_scale", 1.0)),
    )
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


def own_vocab(
    kind: str, path: str, tensors: dict[str, torch.Tensor], draft_vocab: int | None, vocab: int, hidden: int
) -> tuple[Any, Any, torch.Tensor | None]:
    """The checkpoint's own embedding and LM head (speculators format, DeepSpec's copies) and its
    draft-vocabulary map, popped from ``tensors``; ``ValueError`` naming a wrong shape."""
    embed = tensors.pop("embed_tokens.weight", None)  # [V, H]
    head = tensors.pop("lm_head.weight", None)  # [Vd, H]
    d2t, t2d = tensors.pop("d2t", None), tensors.pop("t2d", None)
    vd = draft_vocab or vocab
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
            f"{kind} checkpoint {path!r}: {wrong or f'draft_vocab_size {vd} < {vocab} needs lm_head and d2t'}"
        )
    own_embed = torch.nn.Embedding(vocab, hidden, _weight=embed, _freeze=True) if embed is not None else None
    own_head = torch.nn.Linear(hidden, vd, bias=False) if head is not None else None
    if own_head is not None and head is not None:
        own_head.weight = torch.nn.Parameter(head, requires_grad=False)
    ids = target_ids(kind, path, d2t, t2d, vocab) if d2t is not None else None
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
    embed, lm_head, ids = own_vocab("DFlash", path, tensors, spec.draft_vocab_size, vocab, ht)
    head = DFlashHead(
        config,
        len(spec.aux_layer_ids),
        embed if embed is not None else target_embed,
        lm_head if lm_head is not None else target.get_output_embeddings(),
    )
    head.spec = spec
    if spec.v2 is not None:
        add_dflash2_modules(head, spec.v2, vocab)
    check_tensors("DFlash", path, module_shapes(head), tensors)
    head.load_state_dict(tensors)
    return place_head(head, target, dtype, vocab, ids), spec


def place_head(head: Any, target: Any, dtype: torch.dtype, vocab: int, ids: torch.Tensor | None) -> Any:
    """``head`` (a loaded ``DFlashHead``) on the target's device in ``dtype``, evaluating, with its
    embedding, LM head and the map ``ids`` of its draft vocabulary into the target's ``vocab`` there too."""
    device = next(target.parameters()).device
    head.target = (
        head.target[0].to(device=device, dtype=dtype),
        head.target[1].to(device=device, dtype=dtype),
    )
    head.vocab = (vocab, None if ids is None else ids.to(device))
    return head.to(device=device, dtype=dtype).eval()


__all__ = [
    "DFlashHead",
    "DFlashSpec",
    "default_target_layer_ids",
    "load_dflash_head",
    "own_vocab",
    "parse_dflash_config",
    "place_head",
]
