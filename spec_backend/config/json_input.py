"""``--speculative-config`` JSON text as a dict, with errors that show what was received."""

from __future__ import annotations

import json
from typing import Any


def json_object(text: Any) -> dict[str, Any]:
    """The JSON object in ``text``; ``ValueError`` for a non-string, bad JSON or a non-object."""
    if not isinstance(text, str):
        raise ValueError(f"speculative_config JSON must be a string, got {type(text).__name__}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"speculative_config is not valid JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(data, dict):
        raise ValueError(
            'speculative_config JSON must be an object such as {"method": "ngram", '
            f'"num_speculative_tokens": 3}}, got {type(data).__name__}: {text[:200]!r}'
        )
    return data


__all__ = ["json_object"]
