"""The cpu backend's native kernels (``csrc/*.cpp``): built once per machine, loaded on first use.

Torch lacks three things the GGUF models we run need: products with Q8_0 weights (int8 codes with one
scale per 32 weights, ``q8_0_projection``), Q4_1 weights against int8-quantized activations
(``int4_linear``), and attention whose every row is independent of the other rows of the call
(``attention.native_attention_rows``; torch's SDPA gives a prompt row different last bits when the
prompt is one token longer). They are compiled together with torch's ``cpp_extension``
(``g++ -O3 -march=native -fopenmp``, which needs ``ninja``; about 15 s) into
``<cache root>/kernels/native-<digest>``, the digest covering the sources, torch's version and the CPU's
flags, and registered as ``torch.ops.spec_backend_native.*``.
An op whose instructions the CPU lacks (the Q4_1 one needs AVX512-VNNI) is simply not defined. When the
build fails the callers keep torch's kernels and log the reason; ``SPEC_BACKEND_NATIVE=0`` (read once
per process) skips the build.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from spec_backend.paths import cache_root

logger = logging.getLogger("spec_backend.backends")

NATIVE_ENV = "SPEC_BACKEND_NATIVE"
_CSRC = Path(__file__).parent / "csrc"
_SOURCES = sorted(_CSRC.glob("*.cpp"))


def _build_digest() -> str:
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    sources = "|".join(source.read_text() for source in sorted([*_SOURCES, *_CSRC.glob("*.h")]))
    key = f"{sources}|{torch.__version__}|{platform.machine()}|{flags}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def native_kernel_error() -> str | None:
    """``None`` once the native kernels are loaded (built on first use), else why they are not."""
    if os.environ.get(NATIVE_ENV, "1") == "0":
        return f"{NATIVE_ENV}=0"
    try:
        from torch.utils.cpp_extension import load

        digest = _build_digest()
        folder = cache_root() / "kernels" / f"native-{digest}"
        folder.mkdir(parents=True, exist_ok=True)
        if not any(folder.glob("*.so")):
            logger.info("spec_backend: building the native CPU kernels into %s (once per machine)", folder)
        load(
            name=f"spec_backend_native_{digest}",
            sources=[str(source) for source in _SOURCES],
            build_directory=str(folder),
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
    except Exception as exc:  # a missing compiler or ninja: torch's kernels still work
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def native_op(name: str) -> Callable[..., torch.Tensor] | None:
    """``torch.ops.spec_backend_native.<name>`` when the kernels are loaded and this CPU has the op."""
    if native_kernel_error() is not None:
        return None
    try:
        op: Callable[..., torch.Tensor] = getattr(torch.ops.spec_backend_native, name)
    except (AttributeError, RuntimeError):
        return None
    return op


__all__ = ["NATIVE_ENV", "native_kernel_error", "native_op"]
