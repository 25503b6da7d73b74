"""The instruction-set variants of the cpu backend's native kernels, and which one this machine runs.

Glossary:

* **variant** — one build of ``csrc/*.cpp`` for one instruction set: its compiler flags, the CPU flags
  (as ``/proc/cpuinfo`` names them) a CPU needs to run it, and the ``torch.ops`` namespace its ops
  register under (``spec_backend_<variant>``), so that several variants can be loaded side by side (the
  tests run every variant this CPU can run). Only the Q4_1 × int8 tile is written per instruction set
  (``csrc/q4_1_<isa>.h``); the rest is GCC vector code that each build lowers to its own registers.
* **order** — per architecture, fastest first: on x86-64 ``avx512_vnni`` (512-bit integer dot products),
  ``avx_vnni`` (the same on 256 bits, Alder Lake and later), ``avx2`` (AVX2 + FMA: x86-64-v3, the
  baseline of the last decade's CPUs; the dot products take two instructions), ``generic`` (no
  ISA flags: any CPU of the architecture, for CPUs older than that and as the last fallback); on ARM
  (``aarch64``, ``arm64``) ``neon_dotprod`` (Armv8.2-A dot products ``sdot``, cpuinfo ``asimddp``:
  Cortex-A55/A75 and later, Neoverse, Graviton 2 and later), ``neon`` (the Armv8-A baseline ``asimd``:
  the dot products widen with ``smlal`` and add pairs), ``generic`` (the same portable C++ as on x86; on
  ARM GCC lowers its vector code to NEON too, and only its Q4_1 tile is plain C++). The ARM variants
  are compiled and their numerics tested on x86 under emulation (``tests/unit/test_arm_variants.py``).
  Without ``/proc/cpuinfo`` (macOS) no flags are known and only ``generic`` is selected.
* **cap** — ``SPEC_BACKEND_ISA=<variant>`` (read at every selection): the kernels run the highest
  variant at or below it in the order that this CPU runs and that builds, so every variant a machine
  can run can be tested on it whatever its highest.
* **selection** — the highest variant this CPU runs (under the cap) that builds; one that does not build
  (an older compiler without its flags) falls back to the next, and the reason is reported
  (``spec-backend backends``).

Every variant computes each output row with the same instruction sequence whatever the batch (what the
engine's guarantee rests on); the SIMD variants give the same bits as one another where
``tests/unit/test_isa_variants.py`` (x86) and ``tests/unit/test_arm_variants.py`` (ARM, emulated) say so.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

#: ``SPEC_BACKEND_ISA=<variant>`` caps the variant the kernels run (module glossary)
ISA_ENV = "SPEC_BACKEND_ISA"

#: x86-64-v3: AVX, AVX2, BMI1/2, F16C, FMA, LZCNT, MOVBE (cpuinfo calls LZCNT ``abm``)
_X86_V3_FLAGS = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe")
_AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")


@dataclass(frozen=True)
class Variant:
    """One build of the native kernels (module glossary)."""

    name: str
    machines: tuple[str, ...]  # platform.machine() values it is built for
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags a CPU needs to run it
    cflags: tuple[str, ...]  # compiler flags of its instruction set
    label: str  # what it is, for people
    #: whether its Q4_1 tile reads float16 scales and minima (converted by an instruction: F16C, NEON's
    #: fcvtl); the generic build converts them in software, slower than reading float32 ones
    #: (``bench_isa_variants.py --kernels --streaming``), so its layers keep float32 (``int4_linear``)
    half_scales: bool = True

    @property
    def namespace(self) -> str:
        """The ``torch.ops`` namespace its ops register under."""
        return f"spec_backend_{self.name}"

    @property
    def macro(self) -> str:
        """The preprocessor name that tells the sources which variant they are built as."""
        return f"SPEC_ISA_{self.name.upper()}"


_X86 = ("x86_64", "AMD64", "amd64")
_ARM = ("aarch64", "arm64")  # Linux, macOS
#: Every variant, fastest first within an architecture (module glossary: order).
VARIANTS: tuple[Variant, ...] = (
    Variant(
        "avx512_vnni",
        _X86,
        (*_X86_V3_FLAGS, *_AVX512_FLAGS),
        ("-march=x86-64-v3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni"),
        "AVX512-VNNI: 512-bit int8 dot products (vpdpbusd)",
    ),
    Variant(
        "avx_vnni",
        _X86,
        (*_X86_V3_FLAGS, "avx_vnni"),
        ("-march=x86-64-v3", "-mavxvnni"),
        "AVX-VNNI: 256-bit int8 dot products (vpdpbusd, VEX)",
    ),
    Variant(
        "avx2", _X86, _X86_V3_FLAGS, ("-march=x86-64-v3",), "AVX2 + FMA (x86-64-v3): vpmaddubsw dot products"
    ),
    Variant(
        "neon_dotprod",
        _ARM,
        ("asimd", "asimddp"),
        ("-march=armv8.2-a+dotprod",),
        "ARM NEON + dot product (Armv8.2-A): int8 dot products (sdot)",
    ),
    Variant("neon", _ARM, ("asimd",), ("-march=armv8-a",), "ARM NEON (Armv8-A): widening multiplies (smlal)"),
    Variant("generic", (), (), (), "no ISA flags: portable C++ for any CPU", half_scales=False),
)


def variant(name: str) -> Variant:
    """The variant called ``name``; a ``ValueError`` lists the known ones otherwise."""
    for v in VARIANTS:
        if v.name == name:
            return v
    raise ValueError(f"unknown ISA variant {name!r}; known: {', '.join(v.name for v in VARIANTS)}")


def machine_variants(machine: str | None = None) -> tuple[Variant, ...]:
    """The variants built for this machine's architecture (``generic`` on every one), fastest first."""
    machine = machine if machine is not None else platform.machine()
    return tuple(v for v in VARIANTS if not v.machines or machine in v.machines)


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on ARM); empty where
    the file does not exist (then only ``generic`` runs)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def missing_flags(v: Variant, flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The CPU flags ``v`` needs that this CPU (or ``flags``) lacks; empty when it runs ``v``."""
    have = cpu_flags() if flags is None else flags
    return tuple(f for f in v.cpu_flags if f not in have)


def runnable_variants(flags: frozenset[str] | None = None) -> tuple[Variant, ...]:
    """The variants of this architecture this CPU runs, fastest first."""
    return tuple(v for v in machine_variants() if not missing_flags(v, flags))


def isa_cap() -> Variant | None:
    """The variant ``SPEC_BACKEND_ISA`` names, or ``None`` when it is unset; a name that is not a variant
    of this architecture is refused with the allowed ones."""
    name = os.environ.get(ISA_ENV, "").strip()
    if not name:
        return None
    allowed = machine_variants()
    for v in allowed:
        if v.name == name:
            return v
    raise ValueError(
        f"{ISA_ENV} must name an ISA variant of this {platform.machine()} machine, one of "
        f"{', '.join(v.name for v in allowed)}; got {name!r}"
    )


def candidates(flags: frozenset[str] | None = None) -> tuple[Variant, ...]:
    """The variants to try in order: those this CPU runs, at or below the cap (module glossary)."""
    runnable = runnable_variants(flags)
    cap = isa_cap()
    if cap is None:
        return runnable
    order = [v.name for v in machine_variants()]
    return tuple(v for v in runnable if order.index(v.name) >= order.index(cap.name))


def why(chosen: Variant, failures: list[tuple[Variant, str]], flags: frozenset[str] | None = None) -> str:
    """Why ``chosen`` runs: the cap, a faster variant that did not build, or that it is the fastest this
    CPU runs."""
    best = runnable_variants(flags)[0]
    cap = isa_cap()
    reasons = []
    if cap is not None:
        reasons.append(f"{ISA_ENV}={cap.name} caps it")
    reasons.extend(f"{v.name} did not build ({error})" for v, error in failures)
    if chosen == best:
        reasons.append("the fastest variant this CPU runs")
    else:
        reasons.append(f"this CPU runs up to {best.name}")
    return "; ".join(reasons)


__all__ = [
    "ISA_ENV",
    "VARIANTS",
    "Variant",
    "candidates",
    "cpu_flags",
    "isa_cap",
    "machine_variants",
    "missing_flags",
    "runnable_variants",
    "variant",
    "why",
]
