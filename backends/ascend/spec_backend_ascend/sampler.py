"""Sampler ops on Ascend: the shared triton sampler kernels with Ascend tuning.

The shared kernels (``spec_backend.sampling.triton_ops``) are not part of the code base yet; until
they are, asking for the Ascend sampler ops fails loudly instead of silently running another
backend's kernels.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from spec_backend.backends.base import BackendNotImplementedError, SamplerTuning

if TYPE_CHECKING:
    from spec_backend.sampling.ops import SamplerOps

TRITON_OPS_MODULE = "spec_backend.sampling.triton_ops"


def ascend_sampler_ops(tuning: SamplerTuning) -> SamplerOps:
    """The triton sampler ops tuned for Ascend (vocab block, vector-core grid cap, host uniforms)."""
    del tuning
    if importlib.util.find_spec(TRITON_OPS_MODULE) is None:
        raise BackendNotImplementedError("ascend", f"the sampler ops (needs {TRITON_OPS_MODULE})")
    raise BackendNotImplementedError("ascend", "the sampler ops (triton-ascend wiring)")
