"""The one registry of drafting methods: name → builder, model-free or not, which hidden states.

Config validation, the embedded engine, the CLI and the vLLM hook all read ``METHODS``; no other list of
methods exists. A method whose ``build`` is ``None`` is known (its configuration is validated as vLLM
does) but has no drafter in this package yet.

Glossary: *model-free* — drafts from the token history alone (no draft weights); *family* — how the
drafter runs: ``host`` (a host algorithm behind ``HostDrafter``), ``draft_model`` (a separate causal LM),
``eagle`` (a head on the target's hidden states), ``head`` (Medusa / MLPSpeculator heads on the last
hidden state), ``record`` (no drafts: records hidden states).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import torch

if TYPE_CHECKING:
    from spec_backend.backends.base import Backend
    from spec_backend.config import SpeculativeConfig
    from spec_backend.proposers.contract import Drafter

Family = Literal["host", "draft_model", "eagle", "head", "record"]


@dataclass(frozen=True)
class DrafterContext:
    """What a builder may use: the resolved config, the device, the loaded target and engine sizes.

    ``num_slots`` is an upper bound (``max_num_seqs``): caches are sized later by ``allocate_caches``.

    ``load_model(path, dtype)`` loads a causal LM (folder or GGUF) with the engine's attention and
    backend preparation; ``dtype=None`` means the target's dtype. ``prepare(head)`` applies the same
    preparation (kernel choices, ``speculative_config['quantization']``) to a loaded head module.
    """

    config: SpeculativeConfig
    device: torch.device
    target: torch.nn.Module
    num_slots: int
    max_model_len: int
    load_model: Callable[[str, torch.dtype | None], torch.nn.Module]
    kv_transfer_config: dict[str, Any] | None = None
    target_vocab: dict[str, int] | None = None  # the target tokenizer's token -> id map, when it has one
    backend: Backend | None = None  # for drafters that capture graphs (None: they run eagerly)
    enforce_eager: bool = True
    target_path: str | None = None  # the target checkpoint's folder (MTP layers live there)
    prepare: Callable[[torch.nn.Module], None] | None = None  # the backend's preparation of draft heads

    def model_path(self, what: str) -> str:
        """``speculative_config.model``; ``ValueError`` saying the method needs ``what`` when unset."""
        if self.config.model is None:
            raise ValueError(f"method={self.config.method!r} needs speculative_config['model'] ({what})")
        return self.config.model


Builder = Callable[[DrafterContext], "Drafter"]


@dataclass(frozen=True)
class MethodSpec:
    """One drafting method (see the module docstring)."""

    name: str
    family: Family
    aux_hidden_states: bool = False  # reads auxiliary target layers (changes the target's forward)
    build: Builder | None = None

    @property
    def model_free(self) -> bool:
        return self.family in ("host", "record")

    @property
    def implemented(self) -> bool:
        return self.build is not None


def _host(ctx: DrafterContext) -> Drafter:
    from spec_backend.proposers import create_proposer
    from spec_backend.proposers.contract import HostDrafter

    return HostDrafter(create_proposer(ctx.config, device=ctx.device), ctx.device)


def _draft_model(ctx: DrafterContext) -> Drafter:
    from spec_backend.proposers.draft_model import build_draft_model_drafter

    return build_draft_model_drafter(ctx)


def _eagle(ctx: DrafterContext) -> Drafter:
    from spec_backend.proposers.eagle import build_eagle_drafter

    return build_eagle_drafter(ctx)


def _eagle3(ctx: DrafterContext) -> Drafter:
    from spec_backend.proposers.eagle import build_eagle3_drafter

    return build_eagle3_drafter(ctx)


def _mtp(ctx: DrafterContext) -> Drafter:
    from spec_backend.proposers.eagle import build_mtp_drafter

    return build_mtp_drafter(ctx)


def _dflash(ctx: DrafterContext) -> Drafter:
    from spec_backend.proposers.dflash import build_dflash_drafter

    return build_dflash_drafter(ctx)


def _medusa(ctx: DrafterContext) -> Drafter:
    from spec_backend.proposers.medusa import build_medusa_drafter

    return build_medusa_drafter(ctx)


def _mlp_speculator(ctx: DrafterContext) -> Drafter:
    from spec_backend.proposers.mlp_speculator import build_mlp_speculator_drafter

    return build_mlp_speculator_drafter(ctx)


def _extract_hidden_states(ctx: DrafterContext) -> Drafter:
    from spec_backend.proposers.extract_hidden_states import build_extractor

    return build_extractor(ctx)


#: Every method of vLLM's ``SpeculativeConfig.method`` (the deprecated aliases live in config.methods).
METHODS: Final[dict[str, MethodSpec]] = {
    spec.name: spec
    for spec in (
        MethodSpec("ngram", "host", build=_host),
        MethodSpec("ngram_gpu", "host", build=_host),
        MethodSpec("suffix", "host", build=_host),
        MethodSpec("draft_model", "draft_model", build=_draft_model),
        MethodSpec("medusa", "head", build=_medusa),
        MethodSpec("mlp_speculator", "head", build=_mlp_speculator),
        MethodSpec("eagle", "eagle", build=_eagle),
        MethodSpec("eagle3", "eagle", aux_hidden_states=True, build=_eagle3),
        MethodSpec("dflash", "eagle", aux_hidden_states=True, build=_dflash),
        MethodSpec("mtp", "eagle", build=_mtp),
        MethodSpec("extract_hidden_states", "record", aux_hidden_states=True, build=_extract_hidden_states),
    )
}


def method_spec(name: str | None) -> MethodSpec:
    """The registry entry of a (normalised) method name; ``ValueError`` listing the known ones."""
    spec = METHODS.get(name) if isinstance(name, str) else None
    if spec is None:
        close = difflib.get_close_matches(name, METHODS, n=1) if isinstance(name, str) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown speculative method {name!r}{hint}; known methods: {', '.join(METHODS)}")
    return spec


def implemented_methods() -> tuple[str, ...]:
    """Methods with a drafter in this package, in registry order."""
    return tuple(name for name, spec in METHODS.items() if spec.implemented)


def build_drafter(ctx: DrafterContext) -> Drafter:
    """The drafter for ``ctx.config.method``; ``NotImplementedError`` for a known method without one."""
    spec = method_spec(ctx.config.method)
    if spec.build is None:
        raise NotImplementedError(
            f"speculative method {spec.name!r} is not implemented yet (available: "
            f"{', '.join(implemented_methods())})"
        )
    return spec.build(ctx)


__all__ = [
    "METHODS",
    "DrafterContext",
    "Family",
    "MethodSpec",
    "build_drafter",
    "implemented_methods",
    "method_spec",
]
