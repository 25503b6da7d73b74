"""Shared by the sampler tests: the triton sampler ops on the reference backend, and every sampler mode.

Import after ``conftest.py`` has set ``TRITON_INTERPRET`` (test modules are imported after it).
"""

from __future__ import annotations

from typing import Any

import torch
from sampler_modes import CONFIG_MODES

from spec_backend.backends.base import SamplerTuning
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.config.rejection import RejectionSamplerConfig as Config
from spec_backend.sampling import RejectionSampler
from spec_backend.sampling.ops import SamplerOps
from spec_backend.sampling.triton.ops import TritonSamplerOps

#: the kernels run here: compiled on a GPU, interpreted on CPU; the reference always runs on CPU
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _to(value: Any, device: torch.device) -> Any:
    """Tensors (also inside tuples) moved to ``device``; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    return value


class OnDevice:
    """Runs each op of ``ops`` on ``DEVICE``: tensor arguments are copied there, results back to CPU."""

    def __init__(self, ops: TritonSamplerOps) -> None:
        self.ops = ops

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.ops, name)
        if not callable(fn):
            return fn

        def run(*args: Any, **kwargs: Any) -> Any:
            out = fn(*(_to(a, DEVICE) for a in args), **kwargs)
            return _to(out, torch.device("cpu"))

        return run


class TritonReferenceBackend(ReferenceBackend):
    """The reference backend with the triton sampler ops (interpreted on CPU)."""

    def __init__(self, tuning: SamplerTuning) -> None:
        super().__init__()
        self.tuning = tuning

    def sampler_ops(self) -> SamplerOps:
        ops: SamplerOps = OnDevice(TritonSamplerOps(self.tuning))
        return ops

    def sampler_tuning(self) -> SamplerTuning:
        return self.tuning


MODES = {**CONFIG_MODES, "synthetic": Config()}
RATES = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]


def make_sampler(mode: str, backend: ReferenceBackend, debug: bool = False) -> RejectionSampler:
    """The sampler of one ``MODES`` entry on ``backend``."""
    if mode == "synthetic":
        return RejectionSampler(
            method="synthetic", backend=backend, synthetic_acceptance_rates=RATES, debug=debug
        )
    return RejectionSampler(MODES[mode], backend=backend, debug=debug)
