"""The ``cpu`` backend: native CPU kernels, packed and quantized linear layers (``backend`` explains)."""

from spec_backend.cpu.backend import CpuBackend

__all__ = ["CpuBackend"]
