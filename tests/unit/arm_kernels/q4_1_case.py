"""Inputs for ``q4_1_driver.cpp`` and the exact results it must print: the Q4_1 x int8 product of
``spec_backend/cpu/csrc/q4_1.h``, per output, for each block in order, the exact integer dot product of the
block's 4-bit codes with the row's int8 codes, then in float32 ``acc = fma(dot, scale * xd, acc)`` and
``acc = fma(low, xs, acc)``."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace

from arm_kernels.harness import bits, fma, mul, random_f32, value

BLOCK, LANES, TILE_BYTES = 32, 16, 256


@dataclass(frozen=True)
class Q4Case:
    """One problem: activations [M, G, 32] int8 with xd, xs [M, G]; tiles [T, G, 256] of codes with
    scale, low [T, G, 16] (floats are float32 values)."""

    rows: int
    groups: int
    tiles: int
    xq: tuple[int, ...]
    xd: tuple[float, ...]
    xs: tuple[float, ...]
    codes: tuple[int, ...]
    scale: tuple[float, ...]
    low: tuple[float, ...]

    def stdin(self, half: bool = False) -> str:
        """The driver's input (its header comment); ``half``: scales and minima as binary16 bits (each
        must be a binary16 value: ``make_case(half=True)``)."""
        floats = [" ".join(str(bits(f)) for f in fs) for fs in (self.xd, self.xs)]
        tile_bits = half_bits if half else bits
        tile_floats = [" ".join(str(tile_bits(f)) for f in fs) for fs in (self.scale, self.low)]
        ints = [" ".join(map(str, self.xq)), *floats, " ".join(map(str, self.codes)), *tile_floats]
        return f"{self.rows} {self.groups} {self.tiles} {16 if half else 32}\n" + "\n".join(ints) + "\n"

    def weight_codes(self, t: int, g: int, j: int, swap_nibbles: bool = False) -> list[int]:
        """Feature j's 32 codes in tile t, block g: byte 64 c + 4 j + b holds code 4 c + b in its low
        nibble and code 16 + 4 c + b in its high one (``swap_nibbles``: the other way round, a wrong
        reading for the negative control)."""
        base = (t * self.groups + g) * TILE_BYTES
        codes = [0] * BLOCK
        for c in range(4):
            for b in range(4):
                byte = self.codes[base + 64 * c + 4 * j + b]
                low_code, high_code = (byte >> 4, byte & 15) if swap_nibbles else (byte & 15, byte >> 4)
                codes[4 * c + b], codes[16 + 4 * c + b] = low_code, high_code
        return codes

    def reference(self, swap_nibbles: bool = False) -> list[list[int]]:
        """out [M, 16 T] as float32 bits, computed exactly (module docstring)."""
        out = []
        for i in range(self.rows):
            row = []
            for t in range(self.tiles):
                for j in range(LANES):
                    acc = 0.0
                    for g in range(self.groups):
                        block = i * self.groups + g
                        x = self.xq[block * BLOCK : (block + 1) * BLOCK]
                        w = self.weight_codes(t, g, j, swap_nibbles)
                        dot = sum(a * b for a, b in zip(w, x, strict=True))
                        at = (t * self.groups + g) * LANES + j
                        acc = fma(float(dot), mul(self.scale[at], self.xd[block]), acc)
                        acc = fma(self.low[at], self.xs[block], acc)
                    row.append(bits(acc))
            out.append(row)
        return out


def half_bits(f: float) -> int:
    """The binary16 bits of ``f``, which must be a binary16 value."""
    (b,) = struct.unpack("<H", struct.pack("<e", f))
    assert struct.unpack("<e", struct.pack("<H", b))[0] == f or f != f, f"{f!r} is not a binary16 value"
    return int(b)


def to_half(f: float) -> float:
    """``f`` rounded to binary16."""
    return float(struct.unpack("<e", struct.pack("<e", f))[0])


#: binary16 values a scale or minimum may take that a plain conversion could get wrong: subnormals (the
#: smallest, the largest), the smallest normal, signed zeros, the largest finite value
HALF_EDGES = (2.0**-24, -(2.0**-24), 1023 * 2.0**-24, 2.0**-14, 0.0, -0.0, 65504.0, -65504.0)


def make_case(seed: int, rows: int = 60, groups: int = 3, tiles: int = 3, half: bool = False) -> Q4Case:
    """Pseudo-random operands with the extremes in block 0: row 0's codes all +127 and row 1's all -127
    against tile 0's codes all 15 (dot products of +-60960, the largest there are). ``half``: scales and
    minima are binary16 values, ``HALF_EDGES`` among them (tile 2, block 1), as a GGUF Q4_1 file stores
    them."""
    rng = random.Random(seed)
    xq = [rng.randint(-127, 127) for _ in range(rows * groups * BLOCK)]
    xq[0:BLOCK] = [127] * BLOCK
    xq[groups * BLOCK : (groups + 1) * BLOCK] = [-127] * BLOCK
    codes = [rng.randrange(256) for _ in range(tiles * groups * TILE_BYTES)]
    codes[0:TILE_BYTES] = [0xFF] * TILE_BYTES
    xd = [random_f32(rng, 1e-4, 1e-2) for _ in range(rows * groups)]
    xs = [random_f32(rng, -2.0, 2.0) for _ in range(rows * groups)]
    scale = [random_f32(rng, -0.05, 0.05) for _ in range(tiles * groups * LANES)]
    low = [random_f32(rng, -0.5, 0.5) for _ in range(tiles * groups * LANES)]
    if half:
        scale, low = [to_half(f) for f in scale], [to_half(f) for f in low]
        at = ((tiles - 1) * groups + 1) * LANES
        scale[at : at + len(HALF_EDGES)] = HALF_EDGES
        low[at : at + len(HALF_EDGES)] = HALF_EDGES[::-1]
    return Q4Case(
        rows,
        groups,
        tiles,
        tuple(xq),
        tuple(xd),
        tuple(xs),
        tuple(codes),
        tuple(scale),
        tuple(low),
    )


def with_code_byte(case: Q4Case, index: int, byte: int) -> Q4Case:
    """``case`` with code byte ``index`` set to ``byte`` (a mutated input)."""
    codes = list(case.codes)
    codes[index] = byte
    return replace(case, codes=tuple(codes))


def with_scales(case: Q4Case, change: Callable[[float], float]) -> Q4Case:
    """``case`` with ``change`` applied to every scale and minimum (a mutated input)."""
    return replace(case, scale=tuple(map(change, case.scale)), low=tuple(map(change, case.low)))


def parse_output(text: str) -> dict[int, list[list[int]]]:
    """The driver's output: for each row tile R, out [M, 16 T] as float32 bits."""
    outputs: dict[int, list[list[int]]] = {}
    current: list[list[int]] = []
    for line in text.splitlines():
        if line.startswith("R "):
            current = outputs.setdefault(int(line.split()[1]), [])
        else:
            current.append([int(b) for b in line.split()])
    return outputs


def show(b: int) -> str:
    """A float32's bits and value, for failure messages."""
    return f"{b:#010x} ({value(b)!r})"
