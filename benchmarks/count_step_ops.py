"""Torch operator calls per engine step on the tiny model of ``bench_step_overhead.py``: a count that does
not move with the machine's load, where wall and CPU times on a shared VM move by 2x from run to run.

    .venv/bin/python benchmarks/count_step_ops.py [--batches 1 16] [--max-tokens 64]

Counts every ATen call that reaches Python's dispatch (a ``TorchDispatchMode``) during one ``generate``
after a warm-up, divided by the engine's steps: the host's work between forwards, which on a CPU costs
5-8 us a call on the reference VM whatever the tensor's size. Calls a native op makes from C++ (the cpu
backend's replayed decoder layers, its greedy verification) are one call each here. Plain decoding and
ngram K = 4 every step (``adaptive_draft_length=False``), greedy, ``ignore_eos``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_step_overhead import NGRAM, prompts


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(model: str, method: str, batch: int, max_tokens: int) -> float:
    from spec_backend.engine import LLM, SamplingParams

    spec = None if method == "plain" else {**NGRAM, "adaptive_draft_length": False}
    llm = LLM(model, speculative_config=spec, max_num_seqs=batch, log_stats_interval=None)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts(batch), params)  # warm-up
    start, count = llm.engine.num_steps, _Count()
    with count:
        llm.generate(prompts(batch), params)
    return count.calls / (llm.engine.num_steps - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 16])
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    from spec_backend.tools.tiny import make_tiny_model

    torch.set_num_threads(1)
    model = make_tiny_model(
        tempfile.mkdtemp(prefix="step-ops-"),
        "llama",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        with_tokenizer=True,
    )
    print(f"{'batch':>5} {'method':<6} {'torch ops per step':>19}")
    for batch in args.batches:
        for method in ("plain", "ngram"):
            print(f"{batch:>5} {method:<6} {ops_per_step(model, method, batch, args.max_tokens):19.1f}")


if __name__ == "__main__":
    main()
