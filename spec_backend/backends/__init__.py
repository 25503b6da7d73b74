"""Backend plugins: the contract (``base``), discovery (``loader``) and the pure-torch reference."""

from spec_backend.backends.base import (
    Availability,
    Backend,
    BackendError,
    BackendNotImplementedError,
    CapturePolicy,
    GraphRunner,
    SamplerTuning,
    TokenLimits,
)
from spec_backend.backends.loader import BackendInfo, list_backends, load_backend

__all__ = [
    "Availability",
    "Backend",
    "BackendError",
    "BackendInfo",
    "BackendNotImplementedError",
    "CapturePolicy",
    "GraphRunner",
    "SamplerTuning",
    "TokenLimits",
    "list_backends",
    "load_backend",
]
