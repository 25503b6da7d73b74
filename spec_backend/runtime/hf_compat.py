"""How to hand a KV cache to a ``transformers`` module, whichever transformers release is installed.

transformers renamed the forward argument ``past_key_values`` to ``cache`` (5.2x: the old name still
works until 5.40 but warns with a ``FutureWarning`` on every call); releases before the rename take only
``past_key_values`` and would swallow an unknown ``cache=`` into ``**kwargs`` and build a cache of their
own. ``cache_kwargs`` reads the module's own ``forward`` signature, so the cache always reaches it under
the name it declares.
"""

from __future__ import annotations

import inspect
from typing import Any

_NAMES: dict[type, str] = {}  # per module class: the name its forward declares


def _cache_name(cls: type) -> str:
    if cls not in _NAMES:
        _NAMES[cls] = _declared_name(cls)
    return _NAMES[cls]


def _declared_name(cls: type) -> str:
    forward = getattr(cls, "forward", None)
    try:
        parameters = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):  # a forward without a readable signature: the old name works everywhere
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def cache_name(cls: type) -> str:
    """The name ``cls.forward`` declares for the cache: ``"cache"``, else ``"past_key_values"``."""
    return _cache_name(cls)


def cache_kwargs(module: Any, cache: Any) -> dict[str, Any]:
    """``{"cache": cache}`` where ``module.forward`` declares ``cache``; else ``{"past_key_values": cache}``
    (transformers releases before the rename)."""
    return {_cache_name(type(module)): cache}


__all__ = ["cache_kwargs", "cache_name"]
