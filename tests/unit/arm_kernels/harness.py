"""Builds and runs the standalone kernel programs of this folder (``q4_1_driver.cpp``, ``vec16_driver.cpp``)
for one ISA variant each: x86 ones with the host's ``g++``, ARM ones with ``aarch64-linux-gnu-g++`` run
under ``qemu-aarch64`` (``scripts/setup_arm_emulation.sh`` installs both); makes their inputs; and computes
the exact float32 results they must print (every float32 operation rounded once, to nearest even, from
exact rationals: no numpy, no float64 shortcuts)."""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from spec_backend.cpu.isa import Variant

HERE = Path(__file__).parent
CSRC = HERE.parents[2] / "spec_backend" / "cpu" / "csrc"
CROSS_CXX = "aarch64-linux-gnu-g++"
CROSS_OBJDUMP = "aarch64-linux-gnu-objdump"
QEMU = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # the cross toolchain's libraries, for qemu's -L


def emulation_missing() -> str | None:
    """Why ARM programs cannot be built and run here, or ``None`` when they can."""
    lacking = [tool for tool in (CROSS_CXX, QEMU) if shutil.which(tool) is None]
    if lacking:
        return f"{' and '.join(lacking)} not installed (scripts/setup_arm_emulation.sh installs them)"
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        return f"no aarch64 C library under {SYSROOT} (scripts/setup_arm_emulation.sh installs it)"
    return None


@dataclass(frozen=True)
class Program:
    """One driver built as one variant (``arm``: with the cross compiler, to run under qemu)."""

    path: Path
    arm: bool

    def run(self, stdin: str, cpu: str = "max") -> subprocess.CompletedProcess[str]:
        """Runs it on ``stdin``; ARM programs under qemu emulating ``cpu`` (``max``: every extension)."""
        command = [QEMU, "-L", str(SYSROOT), "-cpu", cpu, str(self.path)] if self.arm else [str(self.path)]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300)


def compile_command(
    driver: str, v: Variant, out: Path, arm: bool, cflags: tuple[str, ...] | None = None
) -> list[str]:
    """The command that compiles ``driver`` (``q4_1`` or ``vec16``) as variant ``v`` into ``out``, for ARM
    (``arm``: the cross compiler) or this host: the kernels' -O3 and the variant's flags and macro (as
    ``native.build_flags`` gives them, less OpenMP and visibility, which a program without torch does not
    need); ``cflags`` replaces the variant's flags."""
    return [
        CROSS_CXX if arm else "g++",
        "-std=c++20",
        "-O3",
        *(v.cflags if cflags is None else cflags),
        f"-D{v.macro}",
        "-DSPEC_OPS=spec_backend_test",
        f"-I{CSRC}",
        str(HERE / f"{driver}_driver.cpp"),
        "-o",
        str(out),
    ]


def build(driver: str, v: Variant, folder: Path, arm: bool) -> Program:
    """``driver`` built as variant ``v`` (for ARM or this host) in ``folder``; a failure says why."""
    out = folder / f"{driver}_{'arm' if arm else 'host'}_{v.name}"
    command = compile_command(driver, v, out, arm)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stderr[-3000:]}"
    return Program(out, arm)


def f32(x: Fraction) -> float:
    """``x`` rounded to the nearest float32, ties to even (the result as a Python float, exactly)."""
    if x == 0:
        return 0.0
    sign, a = (-1 if x < 0 else 1), abs(x)
    exponent = a.numerator.bit_length() - a.denominator.bit_length()  # 2^e <= a < 2^(e+1), maybe e - 1
    if Fraction(2) ** exponent > a:
        exponent -= 1
    quantum = Fraction(2) ** (max(exponent, -126) - 23)  # subnormals below 2^-126
    whole, rest = divmod(a / quantum, 1)
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2 == 1):
        whole += 1
    rounded = whole * quantum
    assert rounded < Fraction(2) ** 128, f"float32 overflow: {float(x)}"
    return sign * float(rounded)


def fma(a: float, b: float, c: float) -> float:
    """float32 ``a * b + c`` rounded once."""
    return f32(Fraction(a) * Fraction(b) + Fraction(c))


def mul(a: float, b: float) -> float:
    """float32 ``a * b``."""
    return f32(Fraction(a) * Fraction(b))


def add(a: float, b: float) -> float:
    """float32 ``a + b``."""
    return f32(Fraction(a) + Fraction(b))


def bits(x: float) -> int:
    """The float32 bits of a float32 value."""
    value: int = struct.unpack("<I", struct.pack("<f", x))[0]
    return value


def value(b: int) -> float:
    """The float32 value of bits ``b``."""
    result: float = struct.unpack("<f", struct.pack("<I", b))[0]
    return result


def random_f32(rng: random.Random, low: float, high: float) -> float:
    """A float32 drawn uniformly from [low, high)."""
    return value(bits(rng.uniform(low, high)))
