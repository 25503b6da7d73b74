"""Validation of ``SamplingParams`` fields: each error names the field, the value received and what is
allowed. vLLM arguments the engine does not implement are refused by name (``ValueError``), never with a
bare ``TypeError``."""

from __future__ import annotations

import math
from typing import Any

#: vLLM ``SamplingParams`` arguments the embedded engine does not implement, with why.
UNSUPPORTED_VLLM_ARGS: dict[str, str] = {
    "best_of": "removed in vLLM's v1 engine; use n",
    "bad_words": "not implemented; use logit_bias with -100 on single tokens",
    "guided_decoding": "vLLM's former name: pass structured_outputs=StructuredOutputsParams(...)",
    "logits_processors": "custom logits processors are not implemented",
    "truncate_prompt_tokens": "not implemented; truncate the prompt before generate()",
    "output_kind": "only final outputs are returned offline (the server streams)",
    "detokenize": "not implemented: text is always decoded when the model has a tokenizer",
    "spaces_between_special_tokens": "not implemented",
    "flat_logprobs": "not implemented: logprobs are a list of dicts, as vLLM's default",
    "extra_args": "not implemented",
    "allowed_token_ids_mask": "not a vLLM argument; use allowed_token_ids",
}


def refuse_unknown(kwargs: dict[str, Any], known: set[str]) -> None:
    """``ValueError`` naming every argument that is not a field (vLLM's unimplemented ones with why)."""
    unknown = sorted(set(kwargs) - known)
    if not unknown:
        return
    parts = [
        f"{name} ({UNSUPPORTED_VLLM_ARGS[name]})" if name in UNSUPPORTED_VLLM_ARGS else name
        for name in unknown
    ]
    raise ValueError(
        f"SamplingParams does not take the argument(s) {', '.join(parts)}; "
        f"it takes: {', '.join(sorted(known))} (see docs/usage.md)"
    )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_int(name: str, value: Any, low: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not is_int(value) or value < low:
        allowed = f"an int >= {low}" + (" or None" if optional else "")
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def check_range(name: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    """``value`` as a float inside ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    inside = is_number(value) and (low < value if low_open else low <= value) and value <= high
    if not inside:
        raise ValueError(f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {value!r}")
    return float(value)


def check_token_list(name: str, value: Any) -> list[int] | None:
    """None, or a list of token ids >= 0."""
    if value is None:
        return None
    ids = list(value) if isinstance(value, list | tuple) else None
    if ids is None or not all(is_int(t) and t >= 0 for t in ids):
        raise ValueError(f"{name} must be a list of token ids (ints >= 0), got {value!r}")
    return ids


def check_logit_bias(value: Any) -> dict[int, float] | None:
    """None, or ``{token_id: bias}`` with biases in [-100, 100] (OpenAI's range; string keys accepted)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"logit_bias must be a dict {{token_id: bias}}, got {type(value).__name__}")
    out: dict[int, float] = {}
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isdigit() else key
        if not is_int(token) or token < 0:
            raise ValueError(f"logit_bias keys must be token ids (ints >= 0), got {key!r}")
        out[token] = check_range(f"logit_bias[{key!r}]", bias, -100.0, 100.0)
    return out


def check_vocab(params: Any, vocab_size: int, index: int) -> None:
    """Token ids in ``params`` must exist in the model's vocabulary (checked when the model is known)."""
    lists = {
        "stop_token_ids": params.stop_token_ids or [],
        "allowed_token_ids": params.allowed_token_ids or [],
        "logit_bias": list(params.logit_bias or {}),
    }
    for name, ids in lists.items():
        bad = [t for t in ids if t >= vocab_size]
        if bad:
            raise ValueError(
                f"sampling_params[{index}].{name} has token ids {bad[:5]} outside the vocabulary "
                f"[0, {vocab_size})"
            )
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(params, name)
        if k is not None and k > vocab_size:
            raise ValueError(
                f"sampling_params[{index}].{name} must be <= the vocabulary size {vocab_size}, got {k}"
            )
