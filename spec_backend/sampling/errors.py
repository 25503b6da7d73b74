"""The rejection sampler's input error, below both of its raisers: the metadata builders
(``sampling.metadata``) and the sampler's input checks (``sampling.validation``)."""

from __future__ import annotations


class SamplerInputError(ValueError):
    """Invalid input to the rejection sampler (shape, range or value)."""


__all__ = ["SamplerInputError"]
