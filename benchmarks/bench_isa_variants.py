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

Run: ``python benchmarks/bench_isa_variants.py --threads 1 --variants avx512_vnni,avx2 --repeats 2``, and
``python benchmarks/bench_isa_variants.py --kernels``.
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
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.kernels:
        return kernels()
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
