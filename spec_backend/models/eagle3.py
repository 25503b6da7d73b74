"""EAGLE-3 draft head (``method="eagle3"``), from the original and the ``speculators`` checkpoint formats.

Formats:

* **original** (``yuhuili/EAGLE3-*``): ``config.json`` is a LlamaConfig of the draft layer plus
  ``draft_vocab_size`` and optional ``target_hidden_size``; weights ``midlayer.*`` (the first layer),
  ``fc.weight [H, 3·Ht]``, ``norm.weight``, ``lm_head.weight [Vd, H]``, ``d2t int64[Vd]``,
  ``t2d bool[V]``, optional ``embed_tokens.weight``.
* **speculators** (``speculators_model_type: "eagle3"``, or ``"peagle"`` for P-EAGLE heads trained
  for parallel drafting, which add ``mask_token_id`` and ``mask_hidden [1, 1, 3·Ht]``): the draft
  layers' config under
  ``transformer_layer_config`` (llama, qwen2 or qwen3), ``draft_vocab_size``, ``norm_before_residual``,
  ``norm_before_fc``, ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids``; weights
  ``layers.{i}.*`` instead of ``midlayer.*``, optional ``input_norm.weight [3·Ht]``.

Glossary: ``Ht`` target hidden size, ``H`` draft hidden size, ``V`` target vocabulary, ``Vd`` draft
vocabulary; ``d2t[i]`` is an *offset*: draft id ``i`` is target id ``i + d2t[i]``; ``t2d`` marks the
target ids in the draft vocabulary. Without ``d2t``, ``Vd == V``.

One forward (``forward``): the committed rows' features ``g = fc(cat(h^{l1}, h^{l2}, h^{l3}))`` (once,
``combine``); the first layer attends over ``cat(input_layernorm(embed(token)), hidden_norm(g))``
(``2H`` wide) with the residual ``g`` (``hidden_norm(g)`` if ``norm_before_residual``); later layers are
ordinary. The output (pre-norm) is the next row's ``g``; logits are ``lm_head(norm(out))`` scattered
into the target vocabulary through ``d2t`` (other ids get ``-inf``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from spec_backend.models.chain_head import ChainHead, decoder_classes, run_layers
from spec_backend.models.checkpoint import (
    check_rows,
    check_tensors,
    module_shapes,
    read_config,
    read_tensors,
    shipped_embedding,
)
from spec_backend.models.draft_vocab import target_ids, to_target_logits
from spec_backend.runtime.hf_compat import cache_kwargs
from spec_backend.step import RaggedAttentionMetadata

#: config flags of the speculators format this loader does not implement (refused, never ignored)
_UNSUPPORTED_FLAGS = ("fc_norm", "norm_output", "enable_sp_ulysses")


@dataclass(frozen=True)
class Eagle3Spec:
    """What a checkpoint's config says (both formats)."""

    layer_config: Any  # transformers config of the draft layers
    model_type: str
    draft_vocab_size: int
    target_hidden_size: int
    norm_before_residual: bool
    norm_before_fc: bool
    use_aux_hidden_state: bool
    aux_layer_ids: tuple[int, ...] | None
    speculators: bool
    mask_token_id: int | None = None  # parallel drafting: the token of the mask rows (P-EAGLE)


def parse_eagle3_config(path: str, raw: dict[str, Any]) -> Eagle3Spec:
    """Read either format's ``config.json`` (see the module docstring)."""
    from transformers import AutoConfig

    speculators = raw.get("speculators_model_type") is not None
    if speculators and raw["speculators_model_type"] not in ("eagle3", "peagle"):
        raise ValueError(
            f"EAGLE-3 checkpoint {path!r} has speculators_model_type={raw['speculators_model_type']!r}, "
            "expected 'eagle3' or 'peagle'"
        )
    bad = [f for f in _UNSUPPORTED_FLAGS if raw.get(f)]
    if bad:
        raise ValueError(f"EAGLE-3 checkpoint {path!r} sets {bad}, which this loader does not implement")
    layer = dict(raw["transformer_layer_config"]) if speculators else dict(raw)
    model_type = str(layer.get("model_type", "llama"))
    skip = ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_config", "model_type")
    cls = type(AutoConfig.for_model(model_type))
    layer_config = cls(**{k: v for k, v in layer.items() if k not in skip})
    eagle_config: dict[str, Any] = raw["eagle_config"] if isinstance(raw.get("eagle_config"), dict) else {}
    ids = raw.get("eagle_aux_hidden_state_layer_ids", eagle_config.get("eagle_aux_hidden_state_layer_ids"))
    hidden = int(layer_config.hidden_size)
    return Eagle3Spec(
        layer_config=layer_config,
        model_type=model_type,
        draft_vocab_size=int(raw.get("draft_vocab_size") or layer_config.vocab_size),
        target_hidden_size=int(raw.get("target_hidden_size") or hidden),
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
        norm_before_fc=bool(raw.get("norm_before_fc", False)),
        use_aux_hidden_state=bool(eagle_config.get("use_aux_hidden_state", True)),
        aux_layer_ids=tuple(int(i) for i in ids) if ids else None,
        speculators=speculators,
        mask_token_id=next(
            (raw[k] for k in ("mask_token_id", "pard_token", "ptd_token_id") if raw.get(k) is not None), None
        ),
    )


class FusedFirstLayer(torch.nn.Module):
    """A backend's fused form of ``Eagle3Head``'s first layer (``Backend.prepare_model`` puts it at
    ``layers.0``; e.g. ``cpu/native_eagle3.py``): called with the next tokens' embeddings, ``g``,
    ``position_embeddings``, the cache, the attention metadata, the mask and the position ids, it returns
    what ``Eagle3Head._first_layer`` does."""


class Eagle3Head(ChainHead):
    """The EAGLE-3 head (see the module docstring)."""

    def __init__(self, spec: Eagle3Spec, embed: torch.nn.Module, lm_head: torch.nn.Module | None) -> None:
        super().__init__()
        layer_cls, norm_cls, rope_cls = decoder_classes(spec.model_type)
        config = spec.layer_config
        h, eps = int(config.hidden_size), float(config.rms_norm_eps)
        self.config, self.spec = config, spec
        ht = spec.target_hidden_size
        self.fc = torch.nn.Linear(3 * ht, h, bias=False) if spec.use_aux_hidden_state else None
        self.input_norm = norm_cls(3 * ht, eps=eps) if spec.norm_before_fc else None
        self.layers = torch.nn.ModuleList(
            [layer_cls(config, i) for i in range(int(config.num_hidden_layers))]
        )
        first: Any = self.layers[0]
        first.hidden_norm = norm_cls(h, eps=eps)
        for name in ("q_proj", "k_proj", "v_proj"):  # the first layer attends over [embedding; hidden]
            proj = getattr(first.self_attn, name)
            setattr(
                first.self_attn, name, torch.nn.Linear(2 * h, proj.out_features, bias=proj.bias is not None)
            )
        self.rotary_emb = rope_cls(config)
        self.norm = norm_cls(h, eps=eps)
        self.embed = embed
        self.lm_head = (
            lm_head if lm_head is not None else torch.nn.Linear(h, spec.draft_vocab_size, bias=False)
        )
        self.vocab_size = int(config.vocab_size)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.int64))  # [Vd]
        self.target_ids: torch.Tensor | None = None  # [Vd] target id of each draft id; None: identity

    def combine(self, features: torch.Tensor) -> torch.Tensor:  # [N, 3·Ht] -> [N, H]
        if self.fc is None:
            return features
        if self.input_norm is not None:
            features = self.input_norm(features)
        out: torch.Tensor = self.fc(features)
        return out

    def mask_features(self) -> torch.Tensor | None:  # [H] the mask rows' g, or None
        mask: torch.Tensor | None = getattr(self, "mask_hidden", None)  # [3·Ht]
        return None if mask is None else self.combine(mask[None])[0]

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, Q]
        hidden: torch.Tensor,  # [B, Q, H]  (g)
        position_ids: torch.Tensor,  # [B, Q]
        cache: Any,
        meta: RaggedAttentionMetadata | None,
        step: int = 0,
        attention_mask: torch.Tensor | None = None,  # [B, 1, Q, KV] bool, training only
    ) -> torch.Tensor:  # [B, Q, H] pre-norm
        first: Any = self.layers[0]
        embeds = self.embed(input_ids).to(hidden.dtype)  # [B, Q, H]
        position_embeddings = self.rotary_emb(hidden, position_ids)
        if isinstance(first, FusedFirstLayer):
            x = first(embeds, hidden, position_embeddings, cache, meta, attention_mask, position_ids)
        else:
            x = self._first_layer(
                embeds, hidden, position_embeddings, cache, meta, attention_mask, position_ids
            )
        return run_layers(self.layers[1:], x, position_ids, position_embeddings, cache, meta, attention_mask)

    def _first_layer(
        self,
        embeds: torch.Tensor,  # [B, Q, H]
        hidden: torch.Tensor,  # [B, Q, H]  (g)
        position_embeddings: Any,
        cache: Any,
        meta: RaggedAttentionMetadata | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,  # [B, Q]
    ) -> torch.Tensor:  # [B, Q, H]
        """The first layer with transformers' modules (module docstring)."""
        first: Any = self.layers[0]
        e = first.input_layernorm(embeds)  # [B, Q, H]
        hn = first.hidden_norm(hidden)  # [B, Q, H]
        residual = hn if self.spec.norm_before_residual else hidden
        x = torch.cat([e, hn], dim=-1)  # [B, Q, 2H]
        attn, _ = first.self_attn(
            hidden_states=x,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            **cache_kwargs(first.self_attn, cache),
            position_ids=position_ids,
            use_cache=True,
            spec_attn_metadata=meta,
        )
        x = residual + attn  # [B, Q, H]
        out: torch.Tensor = x + first.mlp(first.post_attention_layernorm(x))
        return out

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., Vd] float
        logits: torch.Tensor = self.lm_head(self.norm(out)).float()
        return logits

    def logits(self, out: torch.Tensor, step: int = 0) -> torch.Tensor:  # [B, H] -> [B, V]
        return to_target_logits(self.draft_logits(out), self.target_ids, self.vocab_size)

    def draft_vocab_logits(
        self, out: torch.Tensor, step: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.draft_logits(out), self.target_ids  # [B, Vd], [Vd] | None


def _rename(name: str) -> str | None:
    if name.startswith("verifier_"):  # training-only tensors
        return None
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


def load_eagle3_head(path: str, target: Any, attn_name: str, dtype: torch.dtype) -> Eagle3Head:
    """Load an EAGLE-3 checkpoint folder (either format) for ``target`` (every shape checked)."""
    raw = read_config("EAGLE-3", path)
    spec = parse_eagle3_config(path, raw)
    spec.layer_config._attn_implementation = attn_name
    tensors = read_tensors("EAGLE-3", path, _rename)
    t2d = tensors.pop("t2d", None)  # [V] bool, checked against d2t
    mask_hidden = tensors.pop("mask_hidden", None)  # P-EAGLE: [1, 1, 3·Ht] features of the mask rows
    target_embed = target.get_input_embeddings()
    vocab, ht = int(target_embed.weight.shape[0]), int(target_embed.weight.shape[1])
    if int(spec.layer_config.vocab_size) != vocab or spec.target_hidden_size != ht:
        raise ValueError(
            f"EAGLE-3 checkpoint {path!r} is for a target with vocab_size {spec.layer_config.vocab_size} and "
            f"hidden size {spec.target_hidden_size}; this target has {vocab} and {ht}"
        )
    _check_vocab_rows(path, spec, tensors, vocab)
    embed = shipped_embedding(tensors, target_embed)
    if embed is target_embed and int(spec.layer_config.hidden_size) != ht:
        raise ValueError(
            f"EAGLE-3 checkpoint {path!r} has a hidden size other than the target's but no embed_tokens"
        )
    shares_head = "lm_head.weight" not in tensors and spec.draft_vocab_size == vocab
    head = Eagle3Head(spec, embed, target.get_output_embeddings() if shares_head else None)
    expected = module_shapes(head, skip=["embed.weight", "d2t"] + (["lm_head.weight"] if shares_head else []))
    check_tensors("EAGLE-3", path, expected, tensors, optional=["d2t"])
    ids = target_ids("EAGLE-3", path, tensors["d2t"], t2d, vocab) if "d2t" in tensors else None  # [Vd]
    if ids is None and spec.draft_vocab_size != vocab:
        raise ValueError(
            f"EAGLE-3 checkpoint {path!r} has draft_vocab_size {spec.draft_vocab_size} < {vocab} but no d2t"
        )
    head.load_state_dict(tensors, strict=False)
    if mask_hidden is not None:
        if mask_hidden.numel() != 3 * ht:
            raise ValueError(
                f"EAGLE-3 checkpoint {path!r}: mask_hidden has shape {list(mask_hidden.shape)}, expected "
                f"{3 * ht} values ([1, 1, {3 * ht}])"
            )
        head.register_buffer("mask_hidden", mask_hidden.reshape(-1))  # [3·Ht]
    device = next(target.parameters()).device
    if ids is not None and (spec.draft_vocab_size != vocab or bool(tensors["d2t"].any())):
        head.target_ids = ids.to(device)  # else the draft vocabulary is the target's, in order
    return head.to(device=device, dtype=dtype).eval()


def _check_vocab_rows(path: str, spec: Eagle3Spec, tensors: dict[str, torch.Tensor], vocab: int) -> None:
    """The shipped vocabulary tensors agree with ``config.json``: ``embed_tokens [V, H]``,
    ``lm_head [Vd, H]`` and ``d2t [Vd]`` (``ModelLoadError`` naming the tensor, its rows and the field)."""
    check_rows(
        "EAGLE-3", path, tensors.get("embed_tokens.weight"), "embed_tokens.weight", vocab, "vocab_size"
    )
    for name in ("lm_head.weight", "d2t"):
        check_rows("EAGLE-3", path, tensors.get(name), name, spec.draft_vocab_size, "draft_vocab_size")


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """vLLM's EAGLE-3 auxiliary layers when the checkpoint names none: ``(2, L // 2, L - 3)``."""
    return (2, num_layers // 2, num_layers - 3)


__all__ = [
    "Eagle3Head",
    "Eagle3Spec",
    "FusedFirstLayer",
    "default_aux_layer_ids",
    "load_eagle3_head",
    "parse_eagle3_config",
]
