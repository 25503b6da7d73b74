"""Draft-model resolution rules: tensor parallelism, context length, ``n_predict`` and head counts.

Each rule skips what it cannot know: a ``None`` target (or an unknown value) disables the check that
needs it rather than failing, so a configuration can be validated before the target model is loaded.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from spec_backend.config.methods import checkpoint_method, detect_draft_method, mtp_hf_config_override
from spec_backend.config.model_configs import ModelConfigLite, ParallelConfigLite
from spec_backend.config.token_tree import chain_tree

if TYPE_CHECKING:
    from spec_backend.config.speculative import SpeculativeConfig

logger = logging.getLogger("spec_backend.config")


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def resolve_draft_tp(
    target_parallel: ParallelConfigLite | None, draft_tp: int | None, draft_model_type: str
) -> int | None:
    """Draft tensor-parallel degree: 1 or the target's.

    Unset: 1 for ``mlp_speculator`` (it cannot run with TP > 1), else the target's degree (``None``
    when there is no target parallel config). Set: must be 1 or the target's degree.
    """
    target_tp = target_parallel.tensor_parallel_size if target_parallel is not None else None
    if draft_tp is None:
        if draft_model_type == "mlp_speculator":
            if target_tp is not None and target_tp > 1:
                logger.warning("mlp_speculator cannot run with tp > 1; using draft_tensor_parallel_size=1")
            return 1
        return target_tp
    if target_tp is not None and draft_tp not in (1, target_tp):
        raise ValueError(
            f"draft_tensor_parallel_size={draft_tp} is not allowed: it must be 1 or the target model's "
            f"tensor_parallel_size ({target_tp})"
        )
    return draft_tp


def resolve_draft_max_model_len(
    speculative_max_model_len: int | None, draft_max_model_len: int | None, target_max_model_len: int | None
) -> int | None:
    """Context length of the draft model.

    ``max_model_len`` (the speculative config's) wins but may exceed neither the draft's nor the target's
    length; otherwise the smaller of the two known lengths; ``None`` when nothing is known.
    """
    limits = {"draft model": draft_max_model_len, "target model": target_max_model_len}
    if speculative_max_model_len is not None:
        for who, limit in limits.items():
            if limit is not None and speculative_max_model_len > limit:
                raise ValueError(
                    f"max_model_len={speculative_max_model_len} cannot be larger than the {who}'s "
                    f"max_model_len={limit}"
                )
        return speculative_max_model_len
    known = [v for v in limits.values() if v is not None]
    return min(known) if known else None


def resolve_n_predict(hf_config: dict[str, Any], num_speculative_tokens: int | None) -> int | None:
    """Default K from the draft config's ``n_predict``; K above it must be a multiple of it.

    Returns the (possibly defaulted) K. An MTP/Medusa/MLP head with ``n_predict`` layers is reused
    ``K / n_predict`` times, hence the divisibility rule.
    """
    raw = hf_config.get("n_predict")
    if raw is None:
        return num_speculative_tokens
    n_predict = _positive_int(raw)
    if n_predict is None:
        raise ValueError(f"the draft model config's n_predict must be a positive integer, got {raw!r}")
    if num_speculative_tokens is None:
        return n_predict
    if num_speculative_tokens > n_predict and num_speculative_tokens % n_predict != 0:
        raise ValueError(
            f"num_speculative_tokens={num_speculative_tokens} must be a multiple of the draft model's "
            f"n_predict={n_predict} when larger than it (the {n_predict} prediction layer(s) are reused); "
            f"use {n_predict * (num_speculative_tokens // n_predict)} or "
            f"{n_predict * (num_speculative_tokens // n_predict + 1)}"
        )
    return num_speculative_tokens


def check_heads_divisible(hf_text_config: dict[str, Any], tensor_parallel_size: int | None) -> None:
    """The draft's attention heads must split evenly across its tensor-parallel ranks (when known)."""
    heads = _positive_int(hf_text_config.get("num_attention_heads"))
    if heads is None or tensor_parallel_size is None or heads % tensor_parallel_size == 0:
        return
    raise ValueError(
        f"the draft model's num_attention_heads={heads} is not divisible by its tensor parallel size "
        f"{tensor_parallel_size}; set draft_tensor_parallel_size to 1 or a divisor of {heads}"
    )


def draft_parallel_config(
    target_parallel: ParallelConfigLite | None, draft_tp: int | None
) -> ParallelConfigLite | None:
    """The target's parallel config with the draft's tensor-parallel degree (``None`` if neither known)."""
    if target_parallel is None:
        return None if draft_tp is None else ParallelConfigLite(tensor_parallel_size=draft_tp)
    tp = draft_tp if draft_tp is not None else target_parallel.tensor_parallel_size
    return target_parallel.model_copy(update={"tensor_parallel_size": tp})


def initial_draft_config(spec: SpeculativeConfig, model: str) -> ModelConfigLite:
    """The draft config to resolve: the one given, the target's (same checkpoint, e.g. MTP) or a bare one."""
    given, target = spec.draft_model_config, spec.target_model_config
    if given is not None:
        if given.model != model:
            raise ValueError(
                f"draft_model_config.model={given.model!r} does not match model={model!r}; "
                "leave one of them unset or make them equal"
            )
        return given.model_copy(deep=True)
    if target is not None and target.model == model:  # same checkpoint (the target's MTP layers)
        return target.model_copy(deep=True)
    return ModelConfigLite(model=model, revision=spec.revision)


def resolve_draft_model(spec: SpeculativeConfig, model: str) -> None:
    """Resolve a model-based method in place: method detection, K from ``n_predict``, the token tree,
    draft TP, the draft's context length and its model/parallel configs."""
    assert spec.method is not None
    draft = initial_draft_config(spec, model)
    hf = mtp_hf_config_override(draft.hf_config)
    raw_type = hf.get("model_type")
    model_type: str = raw_type if isinstance(raw_type, str) else ""
    declared, parallel, declared_k = checkpoint_method(hf)
    if declared is not None:
        if spec.method not in ("draft_model", declared):
            raise ValueError(
                f"method={spec.method!r} does not match the draft checkpoint {model!r}, which is a "
                f"{declared!r} checkpoint; use method={declared!r} or leave method unset"
            )
        spec.method = declared
        spec.parallel_drafting = spec.parallel_drafting or parallel
        if spec.num_speculative_tokens is None:
            spec.num_speculative_tokens = declared_k
    spec.method = detect_draft_method(spec.method, model, model_type, spec.num_speculative_tokens)
    if spec.method in ("dflash", "dspark"):
        spec.parallel_drafting = True
    if spec.num_speculative_tokens is not None and "num_lookahead_tokens" in hf:
        hf["num_lookahead_tokens"] = spec.num_speculative_tokens
    spec.num_speculative_tokens = resolve_n_predict(hf, spec.num_speculative_tokens)
    if spec.speculative_token_tree is None:  # a given tree is validated and sorted by SpeculativeConfig
        if spec.num_speculative_tokens is None:
            raise ValueError(
                f"a draft model was given (model={model!r}) but neither num_speculative_tokens nor "
                "speculative_token_tree, and its config defines no n_predict; set num_speculative_tokens"
            )
        spec.check_k_bound(spec.num_speculative_tokens)
        spec.speculative_token_tree = chain_tree(spec.num_speculative_tokens)
    target_len = spec.target_model_config.max_model_len if spec.target_model_config else None
    spec.draft_tensor_parallel_size = resolve_draft_tp(
        spec.target_parallel_config, spec.draft_tensor_parallel_size, model_type
    )
    updates: dict[str, Any] = {
        "hf_config": hf,
        "max_model_len": resolve_draft_max_model_len(spec.max_model_len, draft.max_model_len, target_len),
    }
    if spec.quantization is not None:
        updates["quantization"] = spec.quantization
    spec.draft_model_config = draft.model_copy(update=updates)
    spec.draft_parallel_config = draft_parallel_config(
        spec.target_parallel_config, spec.draft_tensor_parallel_size
    )


__all__ = [
    "check_heads_divisible",
    "draft_parallel_config",
    "initial_draft_config",
    "resolve_draft_max_model_len",
    "resolve_draft_model",
    "resolve_draft_tp",
    "resolve_n_predict",
]
