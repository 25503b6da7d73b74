"""Prompts accepted by ``LLM.generate``, checked at the door (vLLM's offline prompt shapes).

A prompt is a non-empty ``str``, a non-empty list (or tuple) of token ids (ints), or a dict in vLLM's
``TextPrompt`` / ``TokensPrompt`` shape: ``{"prompt": str}`` or ``{"prompt_token_ids": [int, ...]}``,
optionally with ``"cache_salt"``: a non-empty string that keeps the request's prompt blocks apart in the
prefix cache (only requests with the same salt share them: tenants' isolation, as in vLLM).
``generate`` takes one prompt or a list of them. Everything else (``None``, bytes, tensors, numbers,
dicts with other keys) is a ``ValueError`` naming the prompt's index and what it got, before any work.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from spec_backend.engine.params import SamplingParams
from spec_backend.engine.params_check import check_vocab

#: What one prompt becomes: its text (None for token ids), its token ids (None until tokenized) and its
#: prefix-cache salt (None: none).
Prompt = tuple[str | None, list[int] | None, str | None]

_DICT_KEYS = ("prompt", "prompt_token_ids")
_ALLOWED = (
    "a string, a list of token ids (ints), or a dict {'prompt': str} / {'prompt_token_ids': [int, ...]}"
)


def _is_token_list(value: object) -> bool:
    return isinstance(value, list | tuple) and all(
        isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in value
    )


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__}: {text[:60]}{'...' if len(text) > 60 else ''}"


def _one(value: object, index: int) -> Prompt:
    if isinstance(value, str):
        if not value:
            raise ValueError(f"prompt {index} is empty")
        return value, None, None
    if isinstance(value, Mapping):
        return _from_dict(value, index)
    if _is_token_list(value):
        ids = [int(t) for t in value]  # type: ignore[attr-defined]
        if not ids:
            raise ValueError(f"prompt {index} is empty (no tokens)")
        return None, ids, None
    hint = (
        " (pass token ids as a list: tensor.tolist())"
        if type(value).__name__ in ("Tensor", "ndarray")
        else ""
    )
    raise ValueError(f"prompt {index} must be {_ALLOWED}; got {_describe(value)}{hint}")


def _from_dict(value: Mapping[Any, Any], index: int) -> Prompt:
    keys = sorted(str(k) for k in value if k != "cache_salt")
    if len(keys) != 1 or keys[0] not in _DICT_KEYS:
        raise ValueError(
            f"prompt {index} is a dict with keys {sorted(str(k) for k in value)}; a dict prompt has exactly "
            "one of 'prompt' (str) or 'prompt_token_ids' (list of ints), and optionally 'cache_salt' (str)"
        )
    key, inner = keys[0], value[keys[0]]
    text = key == "prompt"
    if not (isinstance(inner, str) if text else _is_token_list(inner)):
        want = "a string" if text else "a list of ints"
        raise ValueError(f"prompt {index}: {key!r} must be {want}, got {_describe(inner)}")
    salt = value.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError(f"prompt {index}: 'cache_salt' must be a non-empty string, got {_describe(salt)}")
    found_text, ids, _ = _one(inner, index)
    return found_text, ids, salt


def parse_prompts(prompts: Any) -> list[Prompt]:
    """One prompt or a list of prompts → ``[(text, token ids)]``, every entry checked (see module doc)."""
    if prompts is None:
        raise ValueError(f"generate() needs prompts: {_ALLOWED}, or a list of them; got None")
    if isinstance(prompts, str | Mapping) or (_is_token_list(prompts) and len(prompts) > 0):
        return [_one(prompts, 0)]
    if not isinstance(prompts, list | tuple):
        return [_one(prompts, 0)]  # raises with the type it got
    if not prompts:
        raise ValueError("generate() needs at least one prompt")
    return [_one(p, i) for i, p in enumerate(prompts)]


def check_token_ids(ids: Sequence[int], index: int, vocab_size: int, max_model_len: int) -> None:
    """Token ids inside the vocabulary, and room left to generate."""
    if len(ids) >= max_model_len:
        raise ValueError(
            f"prompt {index} has {len(ids)} tokens; max_model_len={max_model_len} leaves no room to "
            "generate (prompt must be shorter than max_model_len)"
        )
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt {index} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")


def params_per_prompt(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    count: int,
    vocab: int,
    no_tokenizer: str | None,
) -> list[SamplingParams]:
    """One checked ``SamplingParams`` per prompt (one given for all, or one each). ``no_tokenizer``: the
    model's name when it has no tokenizer (stop strings cannot be matched then)."""
    if sampling_params is None:
        params_list = [SamplingParams()] * count
    elif isinstance(sampling_params, SamplingParams):
        params_list = [sampling_params] * count
    else:
        params_list = list(sampling_params)
        if len(params_list) != count:
            raise ValueError(
                f"got {len(params_list)} SamplingParams for {count} prompts; pass one, or one per prompt"
            )
    for i, params in enumerate(params_list):
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params[{i}] must be a SamplingParams, got {type(params).__name__}")
        if params.stop and no_tokenizer is not None:
            raise ValueError(
                f"sampling_params[{i}] has stop strings {params.stop!r} but model {no_tokenizer} "
                "has no tokenizer to match them; use stop_token_ids"
            )
        check_vocab(params, vocab, i)
    return params_list


__all__ = ["Prompt", "check_token_ids", "params_per_prompt", "parse_prompts"]
