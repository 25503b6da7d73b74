"""Module attributes imported on first access (PEP 562), for packages whose light import matters."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(module: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``where[name]`` and returns its ``name`` on first use."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
