"""Checks of a draft model (``method="draft_model"``) against the target and the engine, at build time:
its vocabulary and tokenizer, the positions it knows, PARD's mask token."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spec_backend.proposers.contract import DrafterContext


def pard_token(draft: Any, path: str) -> int:
    """The mask token of a PARD draft model (``pard_token`` or ``ptd_token_id`` in its config)."""
    config = draft.config
    token = next((getattr(config, k) for k in ("pard_token", "ptd_token_id") if hasattr(config, k)), None)
    vocab = int(draft.get_input_embeddings().weight.shape[0])
    if token is None:
        raise ValueError(
            "parallel_drafting=True with method='draft_model' needs a PARD draft model: its config.json "
            f"must name the mask token as pard_token or ptd_token_id, and {path!r} has neither"
        )
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
        raise ValueError(
            f"draft model {path!r}: pard_token must be a token id in [0, {vocab}), got {token!r}"
        )
    return token


def check_positions(draft: Any, path: str, max_model_len: int) -> None:
    """The draft model must know every position a request can reach (``max_model_len``): past its
    ``max_position_embeddings`` its position encoding was never trained (or does not exist)."""
    config = draft.config.get_text_config() if hasattr(draft.config, "get_text_config") else draft.config
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and limit < max_model_len:
        raise ValueError(
            f"the draft model {path!r} has max_position_embeddings={limit}, fewer than the engine's "
            f"max_model_len={max_model_len}; use a draft model with at least {max_model_len} positions, "
            f"or pass LLM(max_model_len={limit})"
        )


def check_vocab(ctx: DrafterContext, draft: Any, path: str) -> None:
    """The draft model must share the target's vocabulary size and, where both have tokenizers, its token
    ids."""
    target: Any = ctx.target
    target_v = int(target.get_output_embeddings().weight.shape[0])
    draft_v = int(draft.get_output_embeddings().weight.shape[0])
    if target_v != draft_v:
        raise ValueError(
            f"the draft model must share the target's vocabulary: target has {target_v} tokens, draft model "
            f"{path!r} has {draft_v}"
        )
    if ctx.target_vocab is None:
        return
    from spec_backend.runtime.loader import load_tokenizer
    from spec_backend.runtime.sources import resolve_model

    tokenizer = load_tokenizer(resolve_model(path))
    if tokenizer is None:
        return
    target_vocab = ctx.target_vocab
    clashes = sorted(t for t, i in tokenizer.get_vocab().items() if target_vocab.get(t, i) != i)
    if clashes:  # tokens both know under different ids (an extra special token on one side is fine)
        example = clashes[0]
        raise ValueError(
            f"the draft model {path!r} has a different tokenizer from the target: {len(clashes)} token(s) "
            f"have different ids, e.g. {example!r} is {tokenizer.get_vocab()[example]} in the draft and "
            f"{target_vocab[example]} in the target; use a draft model trained with the target's tokenizer"
        )


__all__ = ["check_positions", "check_vocab", "pard_token"]
