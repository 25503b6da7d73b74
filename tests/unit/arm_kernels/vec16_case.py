"""Inputs for ``vec16_driver.cpp`` and the exact results it must print (``spec_backend/cpu/csrc/vec16.h``):
``sum16``'s fixed pairwise order, and the dot product ``acc += a * b`` with or without FMA contraction
(GCC contracts ``a * b + c`` to one FMA where the ISA has one: every ARM build and the x86 SIMD builds,
not x86's generic build, which has no FMA instruction)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction

from arm_kernels.harness import add, bits, f32, fma, mul, random_f32


@dataclass(frozen=True)
class VecCase:
    """a, b [n] and e [n] (e <= 0), n a multiple of 16, as float32 values."""

    a: tuple[float, ...]
    b: tuple[float, ...]
    e: tuple[float, ...]

    def stdin(self) -> str:
        """The driver's input (its header comment)."""
        lines = [" ".join(str(bits(f)) for f in fs) for fs in (self.a, self.b, self.e)]
        return f"{len(self.a)}\n" + "\n".join(lines) + "\n"

    def sum16(self) -> list[int]:
        """sum16 of each 16 values of a, as bits: (s[i] + s[i+8]) + (s[i+4] + s[i+12]) for i < 4, then
        (b0 + b2) + (b1 + b3)."""
        out = []
        for k in range(0, len(self.a), 16):
            out.append(bits(sum16(list(self.a[k : k + 16]))))
        return out

    def dots(self, fused: bool) -> list[int]:
        """For k = 1 .. n / 16, sum16 of the 16 lanes of acc after k steps of ``acc += a * b``, as bits:
        one FMA per lane and step (``fused``) or a rounded product then a rounded sum."""
        acc = [0.0] * 16
        out = []
        for k in range(0, len(self.a), 16):
            for lane in range(16):
                x, y = self.a[k + lane], self.b[k + lane]
                acc[lane] = fma(x, y, acc[lane]) if fused else add(acc[lane], mul(x, y))
            out.append(bits(sum16(acc)))
        return out

    def exps(self, fused: bool) -> list[int]:
        """exp16 of e, as bits (``exp_lanes``), each ``a * b + c`` of its source one FMA (``fused``, as
        GCC contracts it: the disassembly shows ``fmla`` for each) or a rounded product then a sum."""
        return [bits(exp_lane(x, fused)) for x in self.e]


def exp_lane(x: float, fused: bool) -> float:
    """vec16.h's exp_lanes for one lane x <= 0 in float32 arithmetic (``VecCase.exps``)."""

    def madd(a: float, b: float, c: float) -> float:
        return fma(a, b, c) if fused else add(mul(a, b), c)

    x = max(x, -87.0)
    k = int(madd(x, _LOG2E, -0.5))  # converted toward zero, as __builtin_convertvector does
    r = madd(float(k), _LN2_LOW, madd(float(k), -0.693359375, x))  # (x - k * hi) + k * low
    p = _INVERSE_FACTORIALS[0]
    for c in _INVERSE_FACTORIALS[1:]:
        p = madd(p, r, c)
    return mul(p, 2.0**k)


_LOG2E = f32(Fraction("1.44269504"))
_LN2_LOW = f32(Fraction("2.12194440e-4"))
#: 1/7!, 1/6!, ..., 1/2!, 1, 1 as float32 constants (``1.0f / 5040.0f`` and so on)
_INVERSE_FACTORIALS = tuple(f32(Fraction(1, n)) for n in (5040, 720, 120, 24, 6, 2, 1, 1))


def sum16(s: list[float]) -> float:
    """vec16.h's sum16 of 16 float32 values, every addition rounded to float32."""
    q = [add(add(s[i], s[i + 8]), add(s[i + 4], s[i + 12])) for i in range(4)]
    return add(add(q[0], q[2]), add(q[1], q[3]))


def make_vec_case(seed: int, n: int = 256) -> VecCase:
    """Pseudo-random operands: a and b in [-1, 1) (products of one size, so the fused and the unfused dot
    products part ways within a few steps), e from -100 (below exp16's floor of -87) to 0, with 0 and -87
    themselves."""
    rng = random.Random(seed)
    a = tuple(random_f32(rng, -1.0, 1.0) for _ in range(n))
    b = tuple(random_f32(rng, -1.0, 1.0) for _ in range(n))
    e = [random_f32(rng, -100.0, 0.0) for _ in range(n)]
    e[0], e[1] = 0.0, -87.0
    return VecCase(a, b, tuple(e))


def parse_vec_output(text: str) -> dict[str, list[int]]:
    """The driver's output: name -> float32 bits."""
    return {line.split()[0]: [int(b) for b in line.split()[1:]] for line in text.splitlines()}
