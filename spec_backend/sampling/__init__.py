"""The rejection sampler of speculative decoding: metadata, verification rules and their kernels.

Public API::

    from spec_backend.sampling import (RejectionSampler, SpecDecodeMetadata, SamplingMetadata,
                                       PLACEHOLDER_TOKEN_ID, FlyConfig, parse_output)
"""

from __future__ import annotations

from spec_backend.config.fly import FlyConfig
from spec_backend.sampling.errors import SamplerInputError
from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata
from spec_backend.sampling.ops import SamplerOps
from spec_backend.sampling.output import build_output, parse_output
from spec_backend.sampling.sampler import METHODS, RejectionSampler
from spec_backend.sampling.sampling_metadata import SamplingMetadata

__all__ = [
    "METHODS",
    "PLACEHOLDER_TOKEN_ID",
    "FlyConfig",
    "RejectionSampler",
    "SamplerInputError",
    "SamplerOps",
    "SamplingMetadata",
    "SpecDecodeMetadata",
    "build_output",
    "parse_output",
]
