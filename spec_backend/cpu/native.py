"""The cpu backend's native kernels (``csrc/*.cpp``): built once per machine and ISA variant, loaded on use.

Torch lacks three things the GGUF models we run need: products with Q8_0 weights (int8 codes with one
scale per 32 weights, ``q8_0_projection``), Q4_1 weights against int8-quantized activations
(``int4_linear``), and attention whose every row is independent of the other rows of the call
(``attention.native_attention_rows``; torch's SDPA gives a prompt row different last bits when the
prompt is one token longer); whole decoder layers (``native_layer``) build on them.

They are compiled with torch's ``cpp_extension`` (``g++ -O3 -fopenmp`` and the variant's ISA flags,
which needs ``ninja``; about 15 s per variant) into ``<cache root>/kernels/<variant>-<digest>``, the
digest covering the sources, the flags, torch's version and the headers compiled against
(``toolchain``; one process builds in a folder at a time, ``_builder``), and registered as
``torch.ops.spec_backend_<variant>.*`` (``isa``: which variants exist, which this CPU runs, the
``SPEC_BACKEND_ISA`` cap). Only the selected variant is built, on first use; one that does not build
falls back to the next, and the reason is kept (``selection()``). ``SPEC_BACKEND_NATIVE=0`` skips them
all: the callers keep torch's kernels and log why. Modules that call native ops (``Int4Linear``,
``NativeDecoderLayer``, ``Q80Projection``) bind the selected variant's ops when they are built; the
row attention function looks its op up at each call. On ARM (aarch64) the variants are ``neon_dotprod``,
``neon`` (Q4_1 tile ``csrc/q4_1_neon.h``) and ``generic``, built and selected the same way; their
kernels are tested on x86 under emulation (``tests/unit/test_arm_variants.py``), not on an ARM machine.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import platform
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from spec_backend.cpu.isa import ISA_ENV, Variant, candidates, missing_flags, variant, why
from spec_backend.paths import cache_root

logger = logging.getLogger("spec_backend.backends")

NATIVE_ENV = "SPEC_BACKEND_NATIVE"
_CSRC = Path(__file__).parent / "csrc"
_SOURCES = sorted(_CSRC.glob("*.cpp"))
#: every variant: optimised, OpenMP threads, nothing exported (two variants' inline functions must never
#: resolve to each other's code when both are loaded)
_COMMON_FLAGS = ("-O3", "-fopenmp", "-fvisibility=hidden", "-fvisibility-inlines-hidden")


def build_flags(v: Variant) -> list[str]:
    """The compiler flags of variant ``v``: common, its ISA, its macro and its op namespace."""
    return [*_COMMON_FLAGS, *v.cflags, f"-D{v.macro}", f"-DSPEC_OPS={v.namespace}"]


def toolchain() -> str:
    """The headers a build compiles against: this torch's folder and Python's include folder. Two
    virtual environments get two build folders, so neither rebuilds the other's (torch's build file
    names the include paths, and a changed build file is a rebuild)."""
    return f"{Path(torch.__file__).parent}|{sysconfig.get_paths()['include']}"


def _build_digest(v: Variant) -> str:
    sources = "|".join(source.read_text() for source in sorted([*_SOURCES, *_CSRC.glob("*.h")]))
    key = f"{sources}|{' '.join(build_flags(v))}|{torch.__version__}|{platform.machine()}|{toolchain()}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def variant_error(name: str) -> str | None:
    """``None`` once variant ``name`` is loaded (built on first use, once per process), else why not;
    nothing of a variant this CPU cannot run is built or loaded."""
    if os.environ.get(NATIVE_ENV, "1") == "0":
        return f"{NATIVE_ENV}=0"
    lacks = missing_flags(variant(name))
    if lacks:
        return f"this CPU lacks {', '.join(lacks)}"
    return _load(name)


def build_folder(v: Variant) -> Path:
    """Where variant ``v`` is built: ``<cache root>/kernels/<variant>-<digest>``."""
    return cache_root() / "kernels" / f"{v.name}-{_build_digest(v)}"


@functools.cache
def _load(name: str) -> str | None:
    v = variant(name)
    try:
        from torch.utils.cpp_extension import load

        folder = build_folder(v)
        folder.mkdir(parents=True, exist_ok=True)
        with _builder(folder):
            if not any(folder.glob("*.so")):
                logger.info(
                    "spec_backend: building the %s CPU kernels in %s (once per machine)", v.name, folder
                )
            load(
                name=f"spec_backend_{v.name}_{folder.name.rsplit('-', 1)[-1]}",
                sources=[str(source) for source in _SOURCES],
                build_directory=str(folder),
                extra_cflags=build_flags(v),
                extra_ldflags=["-fopenmp"],
                is_python_module=False,
                verbose=False,
            )
    except Exception as exc:  # a missing compiler, ninja or ISA flag: the next variant, or torch's kernels
        return _first_lines(exc)
    return None


@contextmanager
def _builder(folder: Path) -> Iterator[None]:
    """Makes this process the only one building or loading in ``folder``: it holds an OS lock on
    ``folder/builder.lock`` (released by the kernel when a process dies, however it dies). Under it a
    torch ``lock`` file can only be left by a build that was interrupted (torch creates one per build and
    waits, forever, while one exists), so it is removed and the build runs again."""
    with open(folder / "builder.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = folder / "lock"
            if stale.exists():
                logger.warning("spec_backend: removing %s, left by an interrupted kernel build", stale)
                stale.unlink()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _first_lines(exc: Exception) -> str:
    """An exception's first line, and the compiler's first error where it quotes one."""
    lines = [line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
    error = next((line for line in lines[1:] if "error" in line.lower()), None)
    return lines[0] + (f" ({error})" if error else "")


@dataclass(frozen=True)
class Selection:
    """The variant the kernels run (``None``: none builds) and why: the cap, a faster variant that did not
    build (with its error), or that it is the fastest this CPU runs."""

    variant: Variant | None
    reason: str


def selection() -> Selection:
    """The variant selected now (``isa`` glossary): the first of ``isa.candidates()`` that builds. Reads
    ``SPEC_BACKEND_ISA`` and ``SPEC_BACKEND_NATIVE`` at every call (cheap: the result is cached per value);
    an unknown ``SPEC_BACKEND_ISA`` raises a ``ValueError`` naming the allowed values."""
    return _selection(os.environ.get(ISA_ENV, ""), os.environ.get(NATIVE_ENV, "1"))


@functools.cache
def _selection(cap: str, native: str) -> Selection:
    del cap  # the cache key: isa.candidates() reads it
    if native == "0":
        return Selection(None, f"{NATIVE_ENV}=0")
    failures: list[tuple[Variant, str]] = []
    for v in candidates():
        error = variant_error(v.name)
        if error is None:
            return Selection(v, why(v, failures))
        failures.append((v, error))
    if not failures:
        return Selection(None, "no ISA variant under the cap runs on this CPU")
    return Selection(None, "; ".join(f"{v.name}: {error}" for v, error in failures))


def native_kernel_error() -> str | None:
    """``None`` when a variant of the native kernels is loaded (built on first use), else why none is."""
    chosen = selection()
    return None if chosen.variant is not None else chosen.reason


def active_variant() -> Variant | None:
    """The variant native ops come from now (``selection``), ``None`` when none builds."""
    return selection().variant


def native_op(name: str, isa: str | None = None) -> Callable[..., torch.Tensor] | None:
    """``torch.ops.spec_backend_<variant>.<name>`` of variant ``isa`` (default: the selected one) when it is
    loaded and defines the op, else ``None``."""
    if isa is None:
        v = active_variant()
        if v is None:
            return None
    else:
        v = variant(isa)
        if variant_error(v.name) is not None:
            return None
    try:
        op: Callable[..., torch.Tensor] = getattr(getattr(torch.ops, v.namespace), name)
    except (AttributeError, RuntimeError):
        return None
    return op


def required_op(name: str) -> Callable[..., torch.Tensor]:
    """``native_op(name)``, or a ``RuntimeError`` saying why the native kernels are not loaded."""
    op = native_op(name)
    if op is None:
        raise RuntimeError(
            f"the native op {name!r} is not available: {native_kernel_error() or 'its variant lacks it'}"
        )
    return op


__all__ = [
    "NATIVE_ENV",
    "Selection",
    "active_variant",
    "build_flags",
    "build_folder",
    "native_kernel_error",
    "native_op",
    "required_op",
    "selection",
    "variant_error",
]
