"""Drafting methods: the drafter contract (``contract``), the method registry (``registry``), and the
factory of host proposers.

``create_proposer(config, device=None)`` builds the host proposer of a model-free method; it reads only
the attributes it needs (vLLM's field names) with ``getattr``, so any object carrying them works:
``method``, ``num_speculative_tokens``, ``prompt_lookup_min/max`` (ngram, ngram_gpu) and
``suffix_decoding_*`` (suffix).

The proposer classes are imported on first use, not with the package: ``spec_backend.config`` reads the
method registry from here, and the vLLM plugin imports the config in every vLLM process. Importing
numba (the suffix kernels) there broke vLLM-CPU's worker start-up, whose kernel-override scan walks
every loaded module (docs/vllm.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spec_backend.config.ngram import resolve_lookup_window
from spec_backend.lazy import lazy_attributes
from spec_backend.proposers.base import Proposer
from spec_backend.proposers.registry import METHODS

if TYPE_CHECKING:
    from spec_backend.proposers.ngram import NgramProposer
    from spec_backend.proposers.ngram_gpu import NgramGpuProposer
    from spec_backend.proposers.suffix import SuffixProposer

_LAZY = {
    "NgramProposer": "spec_backend.proposers.ngram",
    "NgramGpuProposer": "spec_backend.proposers.ngram_gpu",
    "SuffixProposer": "spec_backend.proposers.suffix",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "IMPLEMENTED_METHODS",
    "KNOWN_METHODS",
    "NgramGpuProposer",
    "NgramProposer",
    "Proposer",
    "SuffixProposer",
    "create_proposer",
]

#: Methods built from a host ``Proposer`` (read from the one registry, ``proposers.registry.METHODS``).
IMPLEMENTED_METHODS: tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.family == "host")
KNOWN_METHODS: tuple[str, ...] = tuple(METHODS)
_ALIASES = {"[ngram]": "ngram"}


def _lookup_window(config: Any, method: str) -> tuple[int, int]:
    """(prompt_lookup_min, prompt_lookup_max) with the config's defaults and limits."""
    lo: int | None = getattr(config, "prompt_lookup_min", None)
    hi: int | None = getattr(config, "prompt_lookup_max", None)
    return resolve_lookup_window(method, lo, hi)


def create_proposer(config: Any, device: Any = None) -> Proposer:
    """Build the proposer for ``config.method``.

    ``device`` is used by device-side proposers (``ngram_gpu``); host proposers ignore it.
    Raises ``ValueError`` for an unknown or missing method (listing the known ones) and
    ``NotImplementedError`` for a known method that has no proposer yet.
    """
    method = getattr(config, "method", None)
    if isinstance(method, str):
        method = "mtp" if method.endswith("_mtp") else _ALIASES.get(method, method)  # vLLM's MTP names
    if method not in KNOWN_METHODS:
        raise ValueError(f"unknown speculative method {method!r}; known methods: {', '.join(KNOWN_METHODS)}")
    if method not in IMPLEMENTED_METHODS:
        if METHODS[method].implemented:
            raise ValueError(
                f"speculative method {method!r} drafts with a model: build it with "
                "spec_backend.proposers.registry.build_drafter (the engine does), not create_proposer"
            )
        raise NotImplementedError(
            f"speculative method {method!r} is not implemented yet "
            f"(available: {', '.join(n for n, m in METHODS.items() if m.implemented)})"
        )
    k = getattr(config, "num_speculative_tokens", None)
    if method == "suffix":
        from spec_backend.proposers.suffix import SuffixProposer

        depth = int(getattr(config, "suffix_decoding_max_tree_depth", 24))
        return SuffixProposer(
            num_speculative_tokens=int(k) if k is not None else depth,
            max_tree_depth=depth,
            max_cached_requests=int(getattr(config, "suffix_decoding_max_cached_requests", 10000)),
            max_spec_factor=float(getattr(config, "suffix_decoding_max_spec_factor", 1.0)),
            min_token_prob=float(getattr(config, "suffix_decoding_min_token_prob", 0.1)),
        )
    if k is None:
        raise ValueError(f"num_speculative_tokens is required for speculative method {method!r}")
    lo, hi = _lookup_window(config, method)
    if method == "ngram":
        from spec_backend.proposers.ngram import NgramProposer

        return NgramProposer(int(k), lo, hi)
    from spec_backend.proposers.ngram_gpu import NgramGpuProposer

    return NgramGpuProposer(int(k), lo, hi, device=device)
