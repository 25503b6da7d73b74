"""Torch operator calls per engine step on the tiny model of ``bench_step_overhead.py``: a count that does
not move with the machine's load, where wall and CPU times on a shared VM move by 2x from run to run.

    .venv/bin/python benchmarks/count_step_ops.py [--batches 1 16] [--max-tokens 64] [--graphs]

Counts every ATen call that reaches Python's dispatch (a ``TorchDispatchMode``) during one ``generate``
after a warm-up, divided by the engine's steps: the host's work between forwards, which on a CPU costs
5-8 us a call on the reference VM whatever the tensor's size. Calls a native op makes from C++ (the cpu
backend's replayed decoder layers, its greedy verification) are one call each here. Plain decoding and
ngram K = 4 every step (``adaptive_draft_length=False``), greedy, ``ignore_eos``.

``--graphs`` runs the engine as on a GPU instead: the reference backend over simulated graphs
(``spec_backend.testing.simulated_graphs``: captured steps, async scheduling on) and counts only the calls
outside the captured callables, the ops a GPU's host issues one by one around its graph replays (each a
launch, ~5-20 us of host time there); methods ``plain``, ``ngram``, ``ngram_gpu``, each with async
scheduling on and off (``sync``).
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
    """Counts ATen calls; outside ``backend``'s captured callables where it has them (``in_graph``)."""

    def __init__(self, backend: Any = None) -> None:
        super().__init__()
        self.calls = 0
        self.backend = backend

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.backend is None or not self.backend.in_graph:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(model: str, method: str, batch: int, max_tokens: int, graphs: bool = False) -> float:
    from spec_backend.engine import LLM, SamplingParams
    from spec_backend.testing.simulated_graphs import SimulatedGraphsBackend

    name, sync = method.removesuffix(" sync"), method.endswith(" sync")
    spec = None if name == "plain" else {**NGRAM, "method": name, "adaptive_draft_length": False}
    backend = SimulatedGraphsBackend(max_capture_size=512) if graphs else None
    llm = LLM(model, speculative_config=spec, max_num_seqs=batch, log_stats_interval=None, backend=backend,
              async_scheduling=False if sync else None)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts(batch), params)  # warm-up
    start, count = llm.engine.num_steps, _Count(backend)
    with count:
        llm.generate(prompts(batch), params)
    return count.calls / (llm.engine.num_steps - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 16])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--graphs", action="store_true", help="simulated graphs: ops outside the replays")
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
    methods = ("plain", "ngram")
    if args.graphs:
        methods = ("plain", "plain sync", "ngram", "ngram sync", "ngram_gpu", "ngram_gpu sync")
    print(f"{'batch':>5} {'method':<14} {'torch ops per step':>19}")
    for batch in args.batches:
        for method in methods:
            ops = ops_per_step(model, method, batch, args.max_tokens, args.graphs)
            print(f"{batch:>5} {method:<14} {ops:19.1f}")


if __name__ == "__main__":
    main()
