"""DSpark drafter (``method="dspark"``): a DFlash-style block backbone, a Markov head and a confidence
head (``dspark_heads``), read from the two published checkpoint formats.

Formats:

* **DeepSpec** (``deepseek-ai/dspark_qwen3_*_block7``): ``config.json`` is the target's Qwen3 config
  copied with ``architectures: ["Qwen3DSparkModel"]``, ``num_hidden_layers`` (draft layers),
  ``num_target_layers``, ``block_size``, ``mask_token_id``, ``target_layer_ids`` (layer *outputs*, ``-1``
  the embeddings), ``markov_rank``, ``markov_head_type``, ``enable_confidence_head``,
  ``confidence_head_with_markov``; weights are DFlash's (``fc``, ``hidden_norm``, ``layers.*``, ``norm``)
  plus ``markov_head.markov_w1.weight [V, r]``, ``markov_head.markov_w2.weight [V, r]``,
  ``confidence_head.proj.{weight [1, H + r], bias [1]}``, and frozen copies of the target's
  ``embed_tokens.weight`` and ``lm_head.weight`` (shared with the target when they equal its own).
* **speculators** 0.9 (``speculators_model_type: "dspark"``): the backbone's config nested in
  ``transformer_layer_config``; ``aux_hidden_state_layer_ids`` (layer *inputs*); ``sample_from_anchor``;
  the same head fields and tensor names; ``lm_head [Vd, H]`` with ``d2t``/``t2d`` for a reduced draft
  vocabulary (then ``markov_w2`` is ``[Vd, r]``), no embedding.

Glossary: *anchor* — the last committed token, the block's first row. *Anchor-predicts layout*
(DeepSpec always; speculators with ``sample_from_anchor: true``) — block row ``j`` predicts the token
after position ``anchor + j``, so a block of ``block_size`` rows drafts ``block_size`` tokens. *DFlash
layout* (``sample_from_anchor: false``, and speculators checkpoints written before that key existed) —
row 0 drafts nothing, row ``j >= 1`` predicts the token at ``anchor + j``: ``block_size - 1`` drafts.
Both layouts condition draft ``k``'s Markov head on the token before it. The block always has the
``block_size`` rows it was trained with (its rows attend to each other), whatever ``K`` is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import torch

from spec_backend.models.checkpoint import check_tensors, module_shapes, read_config, read_tensors
from spec_backend.models.dflash import DFlashHead, DFlashSpec, own_vocab, place_head
from spec_backend.models.dspark_heads import MARKOV_TYPES, ConfidenceHead, MarkovHead

logger = logging.getLogger(__name__)

#: architectures DeepSpec writes for other backbones, refused by name
_OTHER_BACKBONES = ("Gemma4DSparkModel", "DSparkDraftModel")
#: config keys that are DSpark's, not the backbone layers' (dropped before building the Qwen3Config)
_DSPARK_KEYS = (
    "architectures", "auto_map", "model_type", "block_size", "num_target_layers", "mask_token_id",
    "target_layer_ids", "num_anchors", "enable_confidence_head", "confidence_head_with_markov",
    "markov_rank", "markov_head_type", "target_model_type",
)  # fmt: skip


@dataclass(frozen=True)
class DSparkSpec:
    """What a DSpark ``config.json`` says (module docstring)."""

    fmt: str  # "deepspec" or "speculators"
    block_size: int  # rows of a block: the anchor and block_size - 1 mask tokens
    mask_token_id: int
    aux_layer_ids: tuple[int, ...]  # residual streams entering these target layers
    anchor_predicts: bool  # the anchor-predicts layout (module docstring)
    markov_rank: int  # 0: no Markov head
    markov_head_type: str
    confidence: bool | None  # a confidence head (None: decided by the checkpoint's tensors)
    confidence_with_markov: bool
    draft_vocab_size: int | None = None

    @property
    def max_drafts(self) -> int:
        return self.block_size if self.anchor_predicts else self.block_size - 1

    @property
    def first_row(self) -> int:
        """The block row of the first draft."""
        return 0 if self.anchor_predicts else 1


class DSparkHead(DFlashHead):
    """DFlash's backbone with DSpark's Markov and confidence heads (``None`` where the checkpoint has
    none)."""

    def __init__(self, config: Any, spec: DSparkSpec, embed: Any, lm_head: Any, vocab: int) -> None:
        super().__init__(config, len(spec.aux_layer_ids), embed, lm_head)
        hidden, rank = int(config.hidden_size), spec.markov_rank
        draft_vocab = spec.draft_vocab_size or vocab
        self.dspark = spec
        self.markov_head = (
            MarkovHead(spec.markov_head_type, hidden, rank, vocab, draft_vocab) if rank else None
        )
        with_markov = spec.confidence_with_markov and rank > 0
        self.confidence_head = ConfidenceHead(hidden + rank * with_markov) if spec.confidence else None


def _int(path: str, raw: dict[str, Any], name: str, low: int, default: int | None = None) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"DSpark checkpoint {path!r}: {name} must be an int >= {low}, got {value!r}")
    return value


def _flag(path: str, raw: dict[str, Any], name: str, default: bool | None) -> bool | None:
    value = raw.get(name, default)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"DSpark checkpoint {path!r}: {name} must be true or false, got {value!r}")
    return value


def _heads(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    rank = _int(path, raw, "markov_rank", 0, 0)
    kind = raw.get("markov_head_type", "vanilla")
    if kind not in MARKOV_TYPES:
        raise ValueError(
            f"DSpark checkpoint {path!r}: markov_head_type must be one of {list(MARKOV_TYPES)}, got {kind!r}"
        )
    return {
        "markov_rank": rank,
        "markov_head_type": kind,
        "confidence": _flag(path, raw, "enable_confidence_head", None),
        "confidence_with_markov": bool(_flag(path, raw, "confidence_head_with_markov", True)),
    }


def _layer_ids(path: str, ids: Any, low: int, high: int, key: str, offset: int) -> tuple[int, ...]:
    if (
        not isinstance(ids, list)
        or not ids
        or any(isinstance(i, bool) or not isinstance(i, int) for i in ids)
    ):
        raise ValueError(f"DSpark checkpoint {path!r}: {key} must be a non-empty list of ints, got {ids!r}")
    if any(not low <= i <= high for i in ids):
        raise ValueError(
            f"DSpark checkpoint {path!r}: {key} {ids} must be layer ids in {low}..{high} for this target"
        )
    return tuple(i + offset for i in ids)


def _deepspec_fields(path: str, raw: dict[str, Any], layers: int) -> tuple[dict[str, Any], DSparkSpec]:
    arch = (raw.get("architectures") or [None])[0]
    if arch != "Qwen3DSparkModel":
        raise ValueError(
            f"DSpark checkpoint {path!r} has architectures[0]={arch!r}; this engine reads Qwen3DSparkModel "
            "(DeepSpec) and speculators_model_type='dspark' checkpoints, not Gemma 4 or DeepSeek-V4 DSpark"
        )
    declared = raw.get("num_target_layers")
    if declared is not None and declared != layers:
        raise ValueError(
            f"DSpark checkpoint {path!r} was trained for a target with num_target_layers={declared!r}; "
            f"this target has {layers} layers"
        )
    ids = _layer_ids(path, raw.get("target_layer_ids"), -1, layers - 1, "target_layer_ids", 1)
    spec = DSparkSpec(
        "deepspec",
        _int(path, raw, "block_size", 1),
        _int(path, raw, "mask_token_id", 0),
        ids,
        anchor_predicts=True,
        **_heads(path, raw),
    )
    return raw, spec


def _speculators_fields(path: str, raw: dict[str, Any], layers: int) -> tuple[dict[str, Any], DSparkSpec]:
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(
            f"DSpark checkpoint {path!r} needs transformer_layer_config (an object), got {layer!r}"
        )
    anchor = _flag(path, raw, "sample_from_anchor", None)
    if anchor is None:  # written by speculators before the key existed: those trained the DFlash layout
        logger.info("DSpark checkpoint %r has no sample_from_anchor: reading the DFlash layout", path)
    ids = raw.get("aux_hidden_state_layer_ids") or [2, layers // 2, layers - 3]
    spec = DSparkSpec(
        "speculators",
        _int(path, raw, "block_size", 2 if not anchor else 1, 8),
        _int(path, raw, "mask_token_id", 0),
        _layer_ids(path, ids, 0, layers, "aux_hidden_state_layer_ids", 0),
        anchor_predicts=bool(anchor),
        draft_vocab_size=raw.get("draft_vocab_size"),
        **_heads(path, raw),
    )
    if not raw.get("sliding_window_non_causal") and "sliding_attention" in (layer.get("layer_types") or []):
        return dict(layer), spec  # sliding layers causal, full layers not: DFlashHead's default rule
    return {**layer, "is_causal": False}, spec


def parse_dspark_config(path: str, raw: dict[str, Any], num_target_layers: int) -> tuple[Any, DSparkSpec]:
    """The backbone layers' Qwen3Config and the DSpark fields of a DeepSpec or speculators config."""
    from transformers import Qwen3Config

    if raw.get("speculators_model_type") is not None:
        if raw["speculators_model_type"] != "dspark":
            raise ValueError(
                f"DSpark checkpoint {path!r} has speculators_model_type={raw['speculators_model_type']!r}"
            )
        layer, spec = _speculators_fields(path, raw, num_target_layers)
    else:
        layer, spec = _deepspec_fields(path, raw, num_target_layers)
    return Qwen3Config(**{k: v for k, v in layer.items() if k not in _DSPARK_KEYS}), spec


def _shared(own: Any, theirs: Any, name: str, path: str) -> Any:
    """The target's module when the checkpoint's copy equals it (DeepSpec saves frozen copies)."""
    if own is None:
        return theirs
    mine, other = own.weight, theirs.weight
    if mine.shape == other.shape and torch.equal(
        mine, other.detach().to(device=mine.device, dtype=mine.dtype)
    ):
        return theirs
    logger.warning(
        "DSpark checkpoint %r: its %s differs from the target's; using the checkpoint's", path, name
    )
    return own


def load_dspark_head(
    path: str, target: Any, attn_name: str, dtype: torch.dtype
) -> tuple[DSparkHead, DSparkSpec]:
    """Load a DeepSpec or speculators DSpark folder for ``target`` (sizes, mask token, every tensor
    checked)."""
    raw = read_config("DSpark", path)
    config, spec = parse_dspark_config(path, raw, int(target.config.get_text_config().num_hidden_layers))
    config._attn_implementation = attn_name
    target_embed = target.get_input_embeddings()
    vocab, ht = int(target_embed.weight.shape[0]), int(target_embed.weight.shape[1])
    if int(config.hidden_size) != ht or spec.mask_token_id >= vocab:
        raise ValueError(
            f"DSpark checkpoint {path!r} (hidden_size {config.hidden_size}, mask_token_id "
            f"{spec.mask_token_id}) does not fit the target (hidden size {ht}, vocabulary {vocab})"
        )
    tensors = read_tensors("DSpark", path, lambda n: None if n.startswith("verifier_") else n)
    if spec.confidence is None:
        spec = replace(spec, confidence="confidence_head.proj.weight" in tensors)
    embed, lm_head, ids = own_vocab("DSpark", path, tensors, spec.draft_vocab_size, vocab, ht)
    embed = _shared(embed, target_embed, "embed_tokens", path)
    lm_head = _shared(lm_head, target.get_output_embeddings(), "lm_head", path) if ids is None else lm_head
    head = DSparkHead(
        config, spec, embed, lm_head if lm_head is not None else target.get_output_embeddings(), vocab
    )
    head.spec = DFlashSpec(spec.block_size, spec.mask_token_id, spec.aux_layer_ids, spec.draft_vocab_size)
    check_tensors("DSpark", path, module_shapes(head), tensors)
    head.load_state_dict(tensors)
    return place_head(head, target, dtype, vocab, ids), spec


__all__ = ["DSparkHead", "DSparkSpec", "load_dspark_head", "parse_dspark_config"]
