"""Async scheduling against the synchronous engine, interleaved in one process: plain decoding (greedy,
``ignore_eos``) of the same prompts through two engines that differ only in ``async_scheduling``, or
``ngram_gpu`` speculation (``--method ngram_gpu``, K = 4 every step: its verify steps launch ahead,
``engine/spec_ahead.py``).

    .venv/bin/python benchmarks/bench_async_scheduling.py [--model tiny|smollm2|PATH] [--backend NAME]
        [--method plain|ngram_gpu] [--batches 1 16] [--max-tokens 128] [--passes 9]

Each pass times one ``generate`` per engine, alternating which goes first, after a warm-up call of each;
the table gives the median tokens per second of each engine and their ratio (async / sync). ``tiny`` is
a 2-layer Llama of hidden 128 (the forward nearly free: the step's host work shows), ``smollm2`` the
bundled model. On a CPU the host computes every op as it is called, so async scheduling has nothing to
overlap (it is off there by default: ``Backend.launches_async``); on a GPU (``--backend cuda``) the
host's work on step n runs while the device computes step n+1. The CPU's ISA flags, or the GPU's name,
are printed with the results.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_step_overhead import cpu_description, prompts  # noqa: E402

from spec_backend.engine import LLM, SamplingParams  # noqa: E402

#: ``--method``: the engine's ``speculative_config`` (``ngram_gpu``: K drafts every step)
METHODS: dict[str, dict[str, object] | None] = {
    "plain": None,
    "ngram_gpu": {"method": "ngram_gpu", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                  "prompt_lookup_max": 4, "adaptive_draft_length": False},
}  # fmt: skip


def measure(
    model: str, backend: str | None, batch: int, max_tokens: int, passes: int, method: str = "plain"
) -> tuple[float, float]:
    """Median tokens/s of the synchronous and the async engine over ``passes`` interleaved passes."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    engines = {
        setting: LLM(
            model,
            backend=backend,
            max_num_seqs=batch,
            log_stats_interval=None,
            async_scheduling=setting,
            speculative_config=METHODS[method],
        )
        for setting in (False, True)
    }
    batch_prompts = prompts(batch)
    for llm in engines.values():
        llm.generate(batch_prompts, params)  # warm-up
    rates: dict[bool, list[float]] = {False: [], True: []}
    for index in range(passes):
        for setting in (False, True) if index % 2 == 0 else (True, False):
            start = time.perf_counter()
            outs = engines[setting].generate(batch_prompts, params)
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            rates[setting].append(tokens / (time.perf_counter() - start))
    return statistics.median(rates[False]), statistics.median(rates[True])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    parser.add_argument("--backend", default=None, help="a backend name (default: load_backend())")
    parser.add_argument("--method", default="plain", choices=sorted(METHODS))
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 16])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--passes", type=int, default=9)
    args = parser.parse_args(argv)
    model = args.model
    if model == "tiny":
        torch.set_num_threads(1)  # a tiny forward runs fastest on one thread
        from spec_backend.tools.tiny import make_tiny_model

        folder = tempfile.mkdtemp(prefix="async-scheduling-")
        model = make_tiny_model(folder, "llama", vocab_size=512, hidden_size=128, intermediate_size=256)
    rows = [
        (b, *measure(model, args.backend, b, args.max_tokens, args.passes, args.method)) for b in args.batches
    ]
    device = torch.cuda.get_device_name() if args.backend == "cuda" else cpu_description()
    what = f"{args.model}, {args.method}, greedy, {args.max_tokens} new tokens, median of {args.passes}"
    print(f"\n{what}; {device}")
    print(f"{'batch':>5} {'sync tok/s':>11} {'async tok/s':>12} {'async/sync':>11}")
    for batch, sync, ahead in rows:
        print(f"{batch:>5} {sync:11.1f} {ahead:12.1f} {ahead / sync:10.3f}x")


if __name__ == "__main__":
    main()
