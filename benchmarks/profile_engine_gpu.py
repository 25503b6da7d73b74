"""Where an engine decode step's time goes with graphs on: the host's Python and the device's kernels.

On an H100 (docs/benchmarks.md, fourth round) a plain graph step of a SmolLM2-shaped model took 6.0 ms at
batch 1, for weights read in ~0.1 ms, and a speculative verify step 12-32 ms: the step around the captured
forward, not the forward, sets the speed (issue 38). This script says which part: over ``--steps`` decode
steps of one request wave (after a warm-up wave) it prints

* ``wall ms/step``: the decode steps' wall time over their count;
* ``device busy ms/step``: the summed time of the kernels they ran (torch.profiler, CUDA activity), so
  ``wall - busy`` is what the device waited for the host;
* the host's Python hot spots (cProfile over the same steps, by own time) and the device's kernels by
  total time (``--rows`` of each).

    python benchmarks/profile_engine_gpu.py                            # smollm2-random, batch 1, plain
    python benchmarks/profile_engine_gpu.py --mode ngram --batch 8
    python benchmarks/profile_engine_gpu.py --dry-run                  # CPU: tiny model, simulated graphs
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine_gpu import LLAMA_1B, SMOLLM2, make_random_llama, prompt_ids, speculative_config

from spec_backend.engine import LLM, SamplingParams
from spec_backend.testing.host_reads import wrapped_decode


def timed_steps(llm: LLM, prompts: list[list[int]], max_tokens: int, profile: Any = None) -> list[float]:
    """Run one wave; return each decode step's wall seconds, with ``profile`` enabled around each step."""
    seconds: list[float] = []

    def timed(step: Callable[[], None]) -> None:
        if profile is not None:
            profile.enable()
        t0 = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t0)
        if profile is not None:
            profile.disable()

    with wrapped_decode(llm, timed):
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    return seconds


def device_table(llm: LLM, prompts: list[list[int]], max_tokens: int, rows: int) -> tuple[float, str, int]:
    """Summed kernel time of one wave (microseconds), its kernel table, and its decode step count."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        steps = len(timed_steps(llm, prompts, max_tokens))
        torch.cuda.synchronize()
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    table = events.table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=70)
    return busy, table, steps


def host_table(profile: cProfile.Profile, rows: int) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(rows)
    return out.getvalue()


def build(args: argparse.Namespace, tmp: str) -> LLM:
    if args.dry_run:  # the GPU's paths (captured steps, async scheduling, steps ahead), simulated
        from spec_backend.testing.simulated_graphs import SimulatedGraphsBackend

        backend: Any = SimulatedGraphsBackend()
    else:
        from spec_backend_cuda import CudaBackend

        backend = CudaBackend()
    shape = LLAMA_1B if args.model == "random-1b" else SMOLLM2
    path = make_random_llama(os.path.join(tmp, "target"), args.dry_run, shape)
    draft = make_random_llama(os.path.join(tmp, "draft"), args.dry_run, {**shape, "num_hidden_layers": 2})
    return LLM(
        path,
        speculative_config=speculative_config(args.mode, args.k, 2.0, draft),
        backend=backend,
        max_num_seqs=args.batch,
        dtype="float32" if args.dry_run else "bfloat16",
        enforce_eager=args.eager,
        log_stats_interval=None,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-random", choices=["smollm2-random", "random-1b"])
    modes = ["plain", "ngram", "ngram_gpu", "synthetic", "synthetic_gpu", "draft"]
    parser.add_argument("--mode", default="plain", choices=modes)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--steps", type=int, default=32, help="new tokens per request in the profiled waves")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--eager", action="store_true", help="graphs off")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny random model, simulated graphs")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (use --dry-run to check the script on CPU)")
    with tempfile.TemporaryDirectory() as tmp:
        llm = build(args, tmp)
        prompts = prompt_ids(llm, args.batch, seed=1)
        timed_steps(llm, prompts, args.steps)  # warm-up: lazy compiles, first replays
        wall = timed_steps(llm, prompts, args.steps)
        profile = cProfile.Profile()
        timed_steps(llm, prompts, args.steps, profile)
        captured = llm.engine.captured is not None
        print(
            f"{args.model} {args.mode} K={args.k} batch {args.batch}, graphs {'on' if captured else 'off'}, "
            f"{len(wall)} decode steps: wall {1e3 * sum(wall) / len(wall):.2f} ms/step"
        )
        if not args.dry_run:
            busy, table, steps = device_table(llm, prompts, args.steps, args.rows)
            print(f"device busy {busy / 1e3 / steps:.2f} ms/step (kernel time summed over {steps} steps)")
            print(table)
        print("host, by own time, over the same number of steps (cProfile):")
        print(host_table(profile, args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
