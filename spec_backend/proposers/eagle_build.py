"""Building the EAGLE-style drafters (``eagle``, ``eagle3``, ``mtp``): each loads its head from the
checkpoint format its method names and wraps it in an ``EagleDrafter`` (``proposers/eagle.py``), which
drafts a chain (its draft steps replayed from graphs where the backend captures them) or a token tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spec_backend.config.token_tree import branching_tree
from spec_backend.proposers.eagle import EagleDrafter
from spec_backend.step import HiddenStateRequest

if TYPE_CHECKING:
    from spec_backend.models.chain_head import ChainHead
    from spec_backend.proposers.contract import DrafterContext


def _drafter(ctx: DrafterContext, head: ChainHead, hidden_states: HiddenStateRequest) -> EagleDrafter:
    config = ctx.config
    assert config.num_speculative_tokens is not None
    if ctx.prepare is not None:
        ctx.prepare(head)
    mask_token = None
    if config.parallel_drafting:
        mask_token = getattr(getattr(head, "spec", None), "mask_token_id", None)
        target: Any = ctx.target
        vocab = int(target.get_input_embeddings().weight.shape[0])
        if isinstance(mask_token, int) and not 0 <= mask_token < vocab:
            raise ValueError(
                f"{config.model!r}: mask_token_id={mask_token} is outside the target vocabulary [0, {vocab})"
            )
        if head.mask_features() is None or mask_token is None:
            raise ValueError(
                f"parallel_drafting=True needs a head trained for it (a P-EAGLE checkpoint with mask_hidden "
                f"and mask_token_id); {config.model!r} (method={config.method!r}) has "
                f"{'no mask_hidden' if head.mask_features() is None else 'no mask_token_id'}"
            )
    drafter = EagleDrafter(
        head,
        hidden_states,
        config.num_speculative_tokens,
        ctx.max_model_len,
        config.uses_draft_probs,
        mask_token,
    )
    if not _drafts_tree(config) and not ctx.enforce_eager:
        drafter.capture_backend = ctx.backend  # a chain: drafts 2..K replay graphs (``captured_head``)
    if _drafts_tree(config) and mask_token is not None:
        raise ValueError(
            "parallel_drafting=True drafts a chain in one forward; it cannot draft a token tree "
            f"(speculative_token_tree={config.speculative_token_tree!r}, tree_top_k={config.tree_top_k!r}, "
            f"tree_paths={config.tree_paths!r}): "
            "use one or the other"
        )
    # a static tree's level feeds up to every node; a dynamic one's (or paths'), its frontier and ancestors
    wide = config.tree_top_k or config.tree_paths or 0
    fed = max(len(branching_tree(config.token_tree) or ()), wide * drafter.headroom)
    drafter.headroom = max(drafter.headroom, fed)
    return drafter


def _drafts_tree(config: Any) -> bool:
    return branching_tree(config.token_tree) is not None or bool(config.tree_top_k or config.tree_paths)


def build_eagle_drafter(ctx: DrafterContext) -> EagleDrafter:
    """Load ``speculative_config.model`` (EAGLE-1 format) for the target."""
    from spec_backend.models.eagle import load_eagle_head

    target: Any = ctx.target
    path = ctx.model_path("an EAGLE-1 checkpoint folder")
    head = load_eagle_head(path, target, str(target.config._attn_implementation), target.dtype)
    return _drafter(ctx, head, HiddenStateRequest(final=True))


def build_eagle3_drafter(ctx: DrafterContext) -> EagleDrafter:
    """Load ``speculative_config.model`` (EAGLE-3, original or speculators format) for the target.

    Auxiliary layers: the checkpoint's ``eagle_aux_hidden_state_layer_ids``, else vLLM's default
    ``(2, L // 2, L - 3)`` for a target with ``L`` layers.
    """
    from spec_backend.models.eagle3 import default_aux_layer_ids, load_eagle3_head

    target: Any = ctx.target
    path = ctx.model_path("an EAGLE-3 checkpoint folder")
    head = load_eagle3_head(path, target, str(target.config._attn_implementation), target.dtype)
    if not head.spec.use_aux_hidden_state:
        return _drafter(ctx, head, HiddenStateRequest(final=True))
    layers = int(target.config.get_text_config().num_hidden_layers)
    ids = head.spec.aux_layer_ids or default_aux_layer_ids(layers)
    if len(ids) != 3 or not all(0 <= i <= layers for i in ids):
        raise ValueError(
            f"EAGLE-3 checkpoint {path!r}: eagle_aux_hidden_state_layer_ids must be 3 layer ids in "
            f"0..{layers} (the target has {layers} layers), got {list(ids)}"
        )
    return _drafter(ctx, head, HiddenStateRequest(aux_layer_ids=tuple(ids)))


def build_mtp_drafter(ctx: DrafterContext) -> EagleDrafter:
    """The target checkpoint's own MTP layers (``speculative_config.model``, default: the target)."""
    from spec_backend.models.mtp import load_mtp_head

    target: Any = ctx.target
    path = ctx.config.model or ctx.target_path
    if path is None:
        raise ValueError("method='mtp' needs the target checkpoint folder (speculative_config['model'])")
    shipped = getattr(target.config.get_text_config(), "num_nextn_predict_layers", None)
    k = ctx.config.num_speculative_tokens or 1
    layers = min(k, shipped) if isinstance(shipped, int) and shipped > 0 else 1
    if layers > 1 and _drafts_tree(ctx.config):
        raise ValueError(
            f"a token tree feeds nodes of several depths in one forward, so it needs one MTP layer; "
            f" {path!r} would use {layers} (num_speculative_tokens={k}, "
            f"num_nextn_predict_layers={shipped}): set num_speculative_tokens=1's chain or a single-layer MTP"
        )
    head = load_mtp_head(path, target, layers, target.dtype)
    return _drafter(ctx, head, HiddenStateRequest(final=True))


__all__ = ["build_eagle3_drafter", "build_eagle_drafter", "build_mtp_drafter"]
