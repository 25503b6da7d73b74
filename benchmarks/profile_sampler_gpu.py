"""Where a rejection-sampler call spends its device time: torch.profiler's kernel table for one case.

    python benchmarks/profile_sampler_gpu.py                      # B=64, K=4, standard, triton ops
    python benchmarks/profile_sampler_gpu.py --batch 1 --mode block+q --impl torch

Prints the kernels sorted by total device time over ``--iters`` calls (after a warm-up), with the call
count per sampler call, so a fixed cost (many small kernels, a full-vocabulary pass at B=1) shows apart
from the per-row bandwidth cost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sampler_bandwidth import MODES, VOCAB, _OpsBackend, implementations, make_inputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--mode", default="standard", choices=list(MODES))
    parser.add_argument("--impl", default="triton", help="triton or torch")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rows", type=int, default=25, help="kernels to print")
    parser.add_argument("--vocab-splits", type=int, default=0, help="programs per row (0: the backend's)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    impls = implementations(
        "cuda", None, with_triton=True, splits=[args.vocab_splits] if args.vocab_splits else None
    )
    name = next(n for n in impls if n.startswith(args.impl))
    mode = MODES[args.mode]
    inputs = make_inputs(args.batch, args.k, VOCAB, "cuda", rotate_bytes=0)
    sampler = mode.sampler(_OpsBackend(impls[name]))
    sampling = inputs.greedy if mode.greedy else inputs.random
    q = inputs.draft_probs[0] if mode.with_q else None

    def call() -> object:
        return sampler(inputs.meta, q, inputs.logits[0], sampling)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.iters):
            call()
        torch.cuda.synchronize()
    print(f"{name} {args.mode} B={args.batch} K={args.k} V={VOCAB}, {args.iters} calls")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
