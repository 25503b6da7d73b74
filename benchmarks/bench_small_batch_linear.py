"""Few-row linear layers on CPU: ``F.linear`` against the tall-skinny product the reference backend uses,
and the packed weight-only kernels (int4 as GGUF Q4_1 layers run, int8) beside them.

A decode step multiplies M rows (batch × (K+1) positions) by every weight of the model. The weights here
have the shapes of SmolLM2-135M's decoder (30 layers × q, k, v, o, gate, up, down; ~480 MB float32, so
they are read from memory, not cache, as in a real step). For each M the script times one pass over all
of them with ``F.linear(x, W)``, with ``TallSkinnyProjection`` (``(W @ x.T).T``, odd M padded to
even), with ``Int4Linear`` (torch's int4 kernel, and our native kernel where it builds) and
with ``Int8Linear``, and prints medians, the float ratio, and each packed kernel's time over its own
one-row time (what verifying K+1 = M positions costs against decoding one).
Usage: ``python benchmarks/bench_small_batch_linear.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from spec_backend.cpu.int4_linear import Int4Linear, quantize_int4
from spec_backend.cpu.int8_linear import Int8Linear
from spec_backend.cpu.native import native_op
from spec_backend.cpu.vocab_projection import TallSkinnyProjection

HIDDEN, KV, MLP, LAYERS = 576, 192, 1536, 30
SHAPES = [
    (HIDDEN, HIDDEN),
    (KV, HIDDEN),
    (KV, HIDDEN),
    (HIDDEN, HIDDEN),
    (MLP, HIDDEN),
    (MLP, HIDDEN),
    (HIDDEN, MLP),
]


def median_ms(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def run_linear(linears: list[nn.Linear], x: dict[int, torch.Tensor]) -> None:
    for lin in linears:
        F.linear(x[lin.in_features], lin.weight)  # [M, out]


def run_modules(modules: list[nn.Module], x: dict[int, torch.Tensor]) -> None:
    for module in modules:
        module(x[int(module.in_features)])  # [M, out]


def packed(linears: list[nn.Linear]) -> dict[str, list[nn.Module]]:
    """The packed variants by name: int4 (torch's kernel), int4 native (ours, of the ISA variant selected:
    ``SPEC_BACKEND_ISA`` caps it, where available), int8."""
    kernels = ["torch", *(["native"] if native_op("q4_1_q8_mm") is not None else [])]
    variants: dict[str, list[nn.Module]] = {}
    for kernel in kernels:
        name = "int4" if kernel == "torch" else "int4 native"
        variants[name] = []
        for linear in linears:
            found = quantize_int4(linear.weight)
            assert found is not None
            variants[name].append(Int4Linear(linear, *found, kernel=kernel))
    variants["int8"] = [Int8Linear(linear) for linear in linears]
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,3,4,5,6,8,12,16,32,64")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    linears = []
    for _ in range(LAYERS):
        for out_features, in_features in SHAPES:
            linear = nn.Linear(in_features, out_features, bias=False)
            linear.weight.data = 0.02 * torch.randn(out_features, in_features, generator=gen)
            linears.append(linear)
    every = frozenset(int(r) for r in args.rows.split(","))  # the tall-skinny product at every M timed
    tall: list[nn.Module] = [TallSkinnyProjection(linear, every) for linear in linears]
    variants = packed(linears)
    print(f"{len(linears)} weights shaped like SmolLM2-135M's decoder, float32, {args.threads} threads")
    head = "".join(f" {name} ms | {name} / its M=1 |" for name in variants)
    rule = "|---:|---:|---:|---:|" + "---:|---:|" * len(variants)
    print(f"| rows M | F.linear ms | tall-skinny ms | ratio |{head}\n{rule}")
    one: dict[str, float] = {}
    with torch.no_grad():
        for m in (int(r) for r in args.rows.split(",")):
            x = {f: torch.randn(m, f, generator=gen) for f in (HIDDEN, MLP)}  # [M, in]
            plain = median_ms(partial(run_linear, linears, x), args.repeats)
            skinny = median_ms(partial(run_modules, tall, x), args.repeats)
            times = {n: median_ms(partial(run_modules, ms, x), args.repeats) for n, ms in variants.items()}
            one = one or times
            cells = "".join(f" {t:.1f} | {t / one[name]:.2f}x |" for name, t in times.items())
            print(f"| {m} | {plain:.1f} | {skinny:.1f} | {plain / skinny:.2f}x |{cells}", flush=True)


if __name__ == "__main__":
    main()
