"""Where spec_backend keeps the files it derives on a machine (GGUF conversions, built kernels).

Glossary:

* **cache root** — ``$SPEC_BACKEND_CACHE`` when set, else ``$XDG_CACHE_HOME/spec_backend``, else
  ``~/.cache/spec_backend``. The GGUF cache keeps its slots under ``gguf/``, the cpu backend its built
  kernels under ``kernels/``.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SPEC_BACKEND_CACHE"


def cache_root() -> Path:
    """The cache root (module glossary)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "spec_backend"


__all__ = ["CACHE_ENV", "cache_root"]
