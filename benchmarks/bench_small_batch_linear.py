"""Few-row linear layers on CPU: ``F.linear`` against the tall-skinny product the reference backend uses,
and the packed weight-only kernels (int4 as GGUF Q4_1 layers run, int8) beside them.

A decode step multiplies M rows (batch × (K+1) positions) by every weight of the model. The weights here
have the shapes of SmolLM2-135M's decoder (30 layers × q, k, v, o, gate, up, down; ~480 MB float32, so
they are read from memory, not cache, as in a real step). For each M the script times one pass over all
of them with ``F.linear(x, W)``, with ``TallSkinnyProjection`` (``(W @ x.T).T``, odd M padded to
even), with ``Int4Linear`` and with ``Int8Linear``, and prints medians, the float ratio, and each packed
kernel's time over its own one-row time (what verifying K+1 = M positions costs against decoding one).
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

from spec_backend.backends.int4_linear import Int4Linear, quantize_int4
from spec_backend.backends.int8_linear import Int8Linear
from spec_backend.backends.vocab_projection import TallSkinnyProjection

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


def packed(linears: list[nn.Linear]) -> tuple[list[nn.Module], list[nn.Module]]:
    int4: list[nn.Module] = []
    for linear in linears:
        found = quantize_int4(linear.weight)
        assert found is not None
        int4.append(Int4Linear(linear, *found))
    return int4, [Int8Linear(linear) for linear in linears]


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
    tall: list[nn.Module] = [TallSkinnyProjection(linear, max_rows=1 << 30) for linear in linears]
    int4, int8 = packed(linears)
    print(f"{len(linears)} weights shaped like SmolLM2-135M's decoder, float32, {args.threads} threads")
    print(
        "| rows M | F.linear ms | tall-skinny ms | ratio | int4 ms | int4 / its M=1 | int8 ms "
        "| int8 / its M=1 |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    one: dict[str, float] = {}
    with torch.no_grad():
        for m in (int(r) for r in args.rows.split(",")):
            x = {f: torch.randn(m, f, generator=gen) for f in (HIDDEN, MLP)}  # [M, in]
            plain = median_ms(partial(run_linear, linears, x), args.repeats)
            skinny = median_ms(partial(run_modules, tall, x), args.repeats)
            q4 = median_ms(partial(run_modules, int4, x), args.repeats)
            q8 = median_ms(partial(run_modules, int8, x), args.repeats)
            one = one or {"int4": q4, "int8": q8}
            print(
                f"| {m} | {plain:.1f} | {skinny:.1f} | {plain / skinny:.2f}x | {q4:.1f} "
                f"| {q4 / one['int4']:.2f}x | {q8:.1f} | {q8 / one['int8']:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
