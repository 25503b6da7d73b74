"""The drafter registry: builds the drafter of a method from the method table (``spec_backend.methods``).

``METHODS`` (re-exported here) is the one list of methods: config validation, the embedded engine, the CLI
and the vLLM hook all read it. Each row names its builder as ``"module:function"``; this module imports it
when a drafter is built, so the table stays free of torch and of the drafters. Two typed entry points:

* ``build_drafter(ctx)`` — the ``Drafter`` of ``ctx.config.method``, for every method (the engine);
* ``build_proposer(config, device)`` — the host ``Proposer`` of a model-free method (``ngram``,
  ``ngram_gpu``, ``suffix``), which ``build_drafter`` wraps in a ``HostDrafter``.

Both take a validated ``SpeculativeConfig``: its ``method`` is already normalised (aliases are resolved in
one place, ``spec_backend.config.methods.normalize_method``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

from spec_backend.methods import METHODS, Family, MethodSpec
from spec_backend.proposers.contract import Drafter, DrafterContext
from spec_backend.proposers.host_drafter import HostDrafter

if TYPE_CHECKING:
    from spec_backend.config import SpeculativeConfig
    from spec_backend.proposers.base import Proposer

#: the builder of a method that drafts with a model: ``DrafterContext -> Drafter``
Builder = Callable[[DrafterContext], Drafter]
#: the builder of a host method: ``(config, device) -> Proposer``
ProposerBuilder = Callable[["SpeculativeConfig", "torch.device | None"], "Proposer"]


def method_spec(name: str | None) -> MethodSpec:
    """The table row of a (normalised) method name; ``ValueError`` listing the known ones."""
    spec = METHODS.get(name) if isinstance(name, str) else None
    if spec is None:
        close = difflib.get_close_matches(name, METHODS, n=1) if isinstance(name, str) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown speculative method {name!r}{hint}; known methods: {', '.join(METHODS)}")
    return spec


def implemented_methods() -> tuple[str, ...]:
    """Methods with a drafter in this package, in table order."""
    return tuple(name for name, spec in METHODS.items() if spec.implemented)


def resolve_builder(spec: MethodSpec) -> Callable[..., Any]:
    """The function ``spec.build`` names; ``NotImplementedError`` for a known method without one."""
    if spec.build is None:
        raise NotImplementedError(
            f"speculative method {spec.name!r} is not implemented yet (available: "
            f"{', '.join(implemented_methods())})"
        )
    module, _, name = spec.build.partition(":")
    builder: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return builder


def build_proposer(config: SpeculativeConfig, device: torch.device | None = None) -> Proposer:
    """The host proposer of a model-free method. ``device`` is used by device-side proposers
    (``ngram_gpu``); host proposers ignore it. ``ValueError`` for a method that drafts with a model."""
    spec = method_spec(config.method)
    if spec.family != "host":
        raise ValueError(
            f"speculative method {spec.name!r} drafts with a model, not a host proposer: build it with "
            "spec_backend.proposers.registry.build_drafter (the engine does); host methods: "
            f"{', '.join(n for n, m in METHODS.items() if m.family == 'host')}"
        )
    return cast(ProposerBuilder, resolve_builder(spec))(config, device)


def build_drafter(ctx: DrafterContext) -> Drafter:
    """The drafter for ``ctx.config.method``; ``NotImplementedError`` for a known method without one."""
    spec = method_spec(ctx.config.method)
    if spec.family == "host":
        return HostDrafter(build_proposer(ctx.config, ctx.device), ctx.device)
    return cast(Builder, resolve_builder(spec))(ctx)


__all__ = [
    "METHODS",
    "Builder",
    "Family",
    "MethodSpec",
    "ProposerBuilder",
    "build_drafter",
    "build_proposer",
    "implemented_methods",
    "method_spec",
    "resolve_builder",
]
