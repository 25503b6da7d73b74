"""n-gram (prompt lookup) settings: the lookup window and its limit.

``prompt_lookup_min`` / ``prompt_lookup_max`` bound the length n of the suffix matched in the context; a
missing bound takes the other's value, and both default to 5 (vLLM's defaults). The host ``ngram``
proposer packs n into 8 bits of its hash-table entries, so it matches at most ``MAX_PROMPT_LOOKUP``
tokens; the device ``ngram_gpu`` proposer has no such limit.
"""

from __future__ import annotations

#: Longest n-gram the host ``ngram`` proposer matches (it stores n in 8 bits).
MAX_PROMPT_LOOKUP = 255
DEFAULT_PROMPT_LOOKUP = 5


def resolve_lookup_window(method: str, lo: int | None, hi: int | None) -> tuple[int, int]:
    """(prompt_lookup_min, prompt_lookup_max) after defaults; ``ValueError`` naming the rule when invalid."""
    if lo is None and hi is None:
        lo = hi = DEFAULT_PROMPT_LOOKUP
    lo = hi if lo is None else lo
    hi = lo if hi is None else hi
    assert lo is not None and hi is not None
    if lo > hi:
        raise ValueError(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
    if method == "ngram" and hi > MAX_PROMPT_LOOKUP:
        raise ValueError(
            f"prompt_lookup_max={hi} is above the ngram proposer's limit of {MAX_PROMPT_LOOKUP} tokens "
            "(use a smaller window, or method='ngram_gpu', which has no such limit)"
        )
    return lo, hi


__all__ = ["DEFAULT_PROMPT_LOOKUP", "MAX_PROMPT_LOOKUP", "resolve_lookup_window"]
