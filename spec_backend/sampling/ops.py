"""Placeholder: the sampler-ops protocol is defined by the rejection-sampler work."""

from __future__ import annotations

from typing import Protocol


class SamplerOps(Protocol):
    """The kernels behind the rejection sampler on one device."""
