"""Checks of ``LLM``'s arguments, before anything loads: each error names the argument, the value
received and what is allowed."""

from __future__ import annotations

from typing import Any


def check_args(
    enforce_eager: Any,
    seed: Any,
    max_num_seqs: Any,
    max_model_len: Any,
    kv_cache_memory_bytes: Any,
    kv_transfer_config: Any,
) -> None:
    if not isinstance(enforce_eager, bool):
        raise ValueError(f"enforce_eager must be a bool, got {enforce_eager!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an int (any value) or None (fresh seeds each run), got {seed!r}")
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be an int >= 1, got {max_num_seqs!r}")
    if max_model_len is not None and (not isinstance(max_model_len, int) or max_model_len < 2):
        raise ValueError(f"max_model_len must be an int >= 2, got {max_model_len!r}")
    if kv_cache_memory_bytes is not None and (
        isinstance(kv_cache_memory_bytes, bool)
        or not isinstance(kv_cache_memory_bytes, int)
        or kv_cache_memory_bytes < 1
    ):
        raise ValueError(
            f"kv_cache_memory_bytes must be None or an int >= 1 (bytes), got {kv_cache_memory_bytes!r}"
        )
    if kv_transfer_config is not None and not isinstance(kv_transfer_config, dict):
        raise ValueError(f"kv_transfer_config must be a dict, got {type(kv_transfer_config).__name__}")


def check_quantization(
    quantization: Any, backend: str, supported: tuple[str, ...], name: str = "quantization"
) -> None:
    """``LLM(quantization=...)`` (or the setting ``name``): None, or a weight-only mode the backend
    implements."""
    if quantization is not None and (not isinstance(quantization, str) or quantization not in supported):
        allowed = (
            f"None or one of {list(supported)}"
            if supported
            else "None (it implements none; `spec-backend backends` lists the others)"
        )
        raise ValueError(
            f"{name}={quantization!r} is not available on backend {backend!r}: allowed are {allowed} "
            "(weight-only, opt-in; the cpu backend also packs GGUF Q4_1 checkpoints without asking)"
        )


def refuse_unsupported(what: str, unsupported: dict[str, Any]) -> None:
    """vLLM arguments this engine does not implement: a ``ValueError`` naming them (not a ``TypeError``)."""
    if unsupported:
        raise ValueError(
            f"{what}() does not implement the vLLM argument(s) {', '.join(sorted(unsupported))}; "
            "see docs/usage.md for the arguments the embedded engine takes"
        )


def check_parallel_args(tensor_parallel_size: Any, executor: Any, async_scheduling: Any) -> None:
    """vLLM's parallelism arguments, accepted so its offline examples run: one device, one process."""
    if tensor_parallel_size != 1:
        raise ValueError(
            "tensor_parallel_size must be 1 (the embedded engine runs on one device), "
            f"got {tensor_parallel_size!r}"
        )
    if executor not in (None, "mp", "uni"):
        raise ValueError(
            f"distributed_executor_backend must be None, 'mp' or 'uni' (one process), got {executor!r}"
        )
    if async_scheduling not in (None, False, True):
        raise ValueError(f"async_scheduling must be a bool or None, got {async_scheduling!r}")


def resolve_max_model_len(model: Any, requested: int | None) -> int:
    """The context length: ``requested``, else the model's position limit capped at 4096. A sliding
    window never bounds it (it bounds what each token sees, the attention applies it)."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    if requested is None:
        return min(int(limit), 4096) if limit else 4096
    if limit and requested > int(limit):
        raise ValueError(
            f"max_model_len={requested} exceeds the model's limit of {limit} positions "
            "(max_position_embeddings)"
        )
    return requested


def eos_token_ids(model: Any, tokenizer: Any | None) -> frozenset[int]:
    """Every EOS id the model's generation config, its config and its tokenizer name."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    if tokenizer is not None and isinstance(getattr(tokenizer, "eos_token_id", None), int):
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
