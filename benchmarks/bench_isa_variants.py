"""The cpu backend's ISA variants and Q4_1 paths on the bundled SmolLM2-135M-Instruct Q4_1 GGUF: decode
tokens/s at batch 1, greedy, plain and ngram K=4, for each ISA variant this CPU runs (``SPEC_BACKEND_ISA``)
and each path (``SPEC_BACKEND_CPU_PATH``: ``measure``, the default, or one pinned).

Each configuration runs in its own process (a variant is selected per process), on the same chat-templated
code-edit prompts as ``bench_cpu_peers.py``, with its decode rate taken as there (first to last token,
from ``RequestOutput.metrics``). Configurations run interleaved, each once per pass (``--repeats``), so
load changes on the machine hit all alike; each row is the median over prompts and passes. The table
names the path each configuration ran and its CPU's SIMD flags.

``--kernels`` times the kernels alone instead, one thread, best of 50 calls, for every variant this CPU
runs, on SmolLM2's shapes: the Q4_1 product (gate|up, 3072×576, 1 and 5 rows), row attention (one decode
row, 9 heads over 3 KV heads of 64, 400 keys) and the Q8_0 LM head (49152×576, 1 row).

``--kernels --streaming`` times them as a decode step meets its weights: not one product called again and
again from the caches, but many distinct copies called in turn (60 layers' gate|up 3072×576 and down
576×1536 Q4_1 products, 80 MB, and three Q8_0 heads, 93 MB: more than the caches hold), ``--threads``
threads, the median over 7 passes of the mean time per call; Q4_1 with float16 scales and minima (what a
Q4_1 file stores) and with float32 ones, 1 and 5 rows (a decode step and a K=4 verify step).

Run: ``python benchmarks/bench_isa_variants.py --threads 1 --variants avx512_vnni,avx2 --repeats 2``,
``python benchmarks/bench_isa_variants.py --kernels`` and ``... --kernels --streaming --threads 2``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def worker(args: argparse.Namespace) -> None:
    """One configuration (this process's environment): JSON with its path and decode tokens/s."""
    import torch

    sys.path.insert(0, str(HERE))
    from bench_cpu_peers import engine_decode, load_engine

    from spec_backend.cpu.native import active_variant
    from spec_backend.cpu.native_layer import NativeDecoderLayer
    from spec_backend.tools.prompts import code_edit_prompts

    torch.set_num_threads(args.threads)
    plain = load_engine(None, 1, [[1]])
    texts = [plain.chat_prompt(m) for m in code_edit_prompts(args.prompts)]
    ids = [list(plain.tokenizer(t)["input_ids"]) for t in texts]
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    spec = load_engine(ngram, 1, ids)
    modules = list(plain.model.modules())
    kernels = sorted({str(m.kernel) for m in modules if hasattr(m, "kernel")})
    native = any(isinstance(m, NativeDecoderLayer) for m in modules)
    rates: dict[str, list[float]] = {"plain": [], "ngram K=4": []}
    for prompt in ids:
        rates["plain"].append(engine_decode(plain, prompt, args.max_tokens)["tps"])
        rates["ngram K=4"].append(engine_decode(spec, prompt, args.max_tokens)["tps"])
    variant = active_variant()
    ran = "native layers" if native else f"int4 {kernels[0]} kernel" if kernels else "float32"
    print(json.dumps({"isa": variant.name if variant else None, "ran": ran, "rates": rates}))


def run(variant: str, path: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "SPEC_BACKEND_ISA": variant, "SPEC_BACKEND_CPU_PATH": path}
    command = [sys.executable, __file__, "--worker", "--threads", str(args.threads),
               "--max-tokens", str(args.max_tokens), "--prompts", str(args.prompts)]  # fmt: skip
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def best_of(call: Any, n: int = 50) -> float:
    """The fastest of ``n`` calls after two warm-ups, in microseconds."""
    import time

    for _ in range(2):
        call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e6


def kernels() -> None:
    """``--kernels`` (module docstring): one row per ISA variant this CPU runs."""
    import torch

    from spec_backend.cpu.int4_linear import q4_1_tiles
    from spec_backend.cpu.isa import runnable_variants
    from spec_backend.cpu.native import native_op

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    tiles = q4_1_tiles(torch.randint(0, 16, (3072, 576), generator=g, dtype=torch.int32))  # [N/16, G, 256]
    scale, low = torch.rand(192, 18, 16, generator=g) / 100, -torch.rand(192, 18, 16, generator=g) / 20
    x1, x5 = torch.randn(1, 576, generator=g), torch.randn(5, 576, generator=g)
    q, k, v = torch.randn(1, 9, 1, 64), torch.randn(1, 3, 400, 64), torch.randn(1, 3, 400, 64)
    codes, block_scale = torch.randint(-127, 128, (49152, 576), dtype=torch.int8), torch.rand(49152, 18)
    print(f"CPU SIMD flags: {simd_flags()}; 1 thread, best of 50 calls, microseconds\n")
    print("| ISA variant | Q4_1 3072×576, 1 row | 5 rows | row attention, 400 keys | Q8_0 head 49152×576 |")
    print("|---|---:|---:|---:|---:|")
    for v_ in runnable_variants():
        mm, rows, head = (native_op(n, v_.name) for n in ("q4_1_q8_mm", "attention_rows", "q8_0_mm"))
        assert mm is not None and rows is not None and head is not None, v_.name
        cells = [
            best_of(partial(mm, x1, tiles, scale, low)),
            best_of(partial(mm, x5, tiles, scale, low)),
            best_of(partial(rows, q, k, v, torch.tensor([1]), torch.tensor([400]), 0.125)),
            best_of(partial(head, x1, codes, block_scale), 10),
        ]
        print(f"| {v_.name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


def per_call(calls: list[Any], passes: int = 7) -> float:
    """Microseconds per call of ``calls`` made in turn: the median over ``passes`` of each pass's mean."""
    import time

    means = []
    for _ in range(passes):
        start = time.perf_counter()
        for call in calls:
            call()
        means.append((time.perf_counter() - start) / len(calls) * 1e6)
    return statistics.median(means)


def streaming(threads: int) -> None:
    """``--kernels --streaming`` (module docstring): one row per ISA variant this CPU runs."""
    import torch

    from spec_backend.cpu.isa import runnable_variants
    from spec_backend.cpu.native import native_op

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    products = []  # (K, tiles [N/16, K/32, 256], scale and low [N/16, K/32, 16] float16)
    for _ in range(60):
        for n, k in ((3072, 576), (576, 1536)):
            tiles = torch.randint(0, 256, (n // 16, k // 32, 256), generator=g, dtype=torch.uint8)
            scale = (torch.rand(n // 16, k // 32, 16, generator=g) / 100).half()
            products.append((k, tiles, scale, (-torch.rand(n // 16, k // 32, 16, generator=g) / 20).half()))
    codes = [torch.randint(-127, 128, (49152, 576), generator=g, dtype=torch.int8) for _ in range(3)]
    heads = [(c, torch.rand(49152, 18, generator=g)) for c in codes]  # Q8_0 codes [V, H], scales [V, H/32]
    xs = {(m, k): torch.randn(m, k, generator=g) for m in (1, 5) for k in (576, 1536)}
    print(f"CPU SIMD flags: {simd_flags()}; {threads} thread(s), weights streamed, microseconds per call\n")
    print("| ISA variant | Q4_1 float16 scales, 1 row | 5 rows | float32 scales, 1 row | 5 rows "
          "| Q8_0 head, 1 row | 5 rows |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for v_ in runnable_variants():
        mm, head = native_op("q4_1_q8_mm", v_.name), native_op("q8_0_mm", v_.name)
        assert mm is not None and head is not None, v_.name
        cells = []
        for wide in (False, True):
            for m in (1, 5):
                calls = [
                    partial(mm, xs[(m, k)], t, s.float() if wide else s, lo.float() if wide else lo)
                    for k, t, s, lo in products
                ]  # fmt: skip
                try:
                    cells.append(per_call(calls))
                except RuntimeError:  # a build from before float16 scales (to compare commits)
                    cells.append(float("nan"))
        cells += [per_call([partial(head, xs[(m, 576)], c, s) for c, s in heads]) for m in (1, 5)]
        print(f"| {v_.name} | " + " | ".join("—" if c != c else f"{c:.1f}" for c in cells) + " |")


def simd_flags() -> str:
    from spec_backend.cpu.isa import cpu_flags

    return " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx", "fma", "f16c", "asimd"))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="passes over the configurations")
    parser.add_argument("--variants", default="", help="comma-separated (default: every one this CPU runs)")
    parser.add_argument(
        "--paths", default="measure", help="comma-separated: measure, native, int4-bf16, float32"
    )
    parser.add_argument("--kernels", action="store_true", help="time the kernels alone (module docstring)")
    parser.add_argument(
        "--streaming", action="store_true", help="with --kernels: weights streamed (docstring)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.kernels:
        return streaming(args.threads) if args.streaming else kernels()
    from spec_backend.cpu.isa import runnable_variants

    variants = args.variants.split(",") if args.variants else [v.name for v in runnable_variants()]
    configs = [(v, p) for v in variants for p in args.paths.split(",")]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in range(args.repeats):
        for config in configs:
            runs[config].append(run(*config, args))
    print(f"CPU SIMD flags: {simd_flags()}; {args.threads} thread(s), {args.max_tokens} tokens, batch 1\n")
    print("| ISA variant | path asked | path ran | plain tokens/s | ngram K=4 tokens/s |")
    print("|---|---|---|---:|---:|")
    for (_, path), results in runs.items():
        medians = [
            statistics.median(x for r in results for x in r["rates"][k]) for k in ("plain", "ngram K=4")
        ]
        ran = ", ".join(sorted({r["ran"] for r in results}))
        print(f"| {results[0]['isa']} | {path} | {ran} | {medians[0]:.1f} | {medians[1]:.1f} |")


if __name__ == "__main__":
    main()
