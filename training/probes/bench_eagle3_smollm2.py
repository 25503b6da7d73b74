"""The trained EAGLE-3 head on the bundled SmolLM2 against plain decoding, ngram and suffix, in one run.

Prompt sets (chat template, ``--max-tokens`` new tokens, ``--n`` prompts each), none trained on:

* ``code-edit`` — the e2e benchmark's copy-heavy prompts (n-gram drafting's home ground);
* ``chat`` — handwritten open questions whose answers copy nothing from the prompt;
* ``instruct`` — instruction prompts on the topics held out of training (``spec_backend_train.prompts``);
* ``source`` — the user turns of corpus chats from files held out of training (``spec_backend_train.corpus``);
* ``instruct-trained`` (only when named in ``--sets``) — instruction prompts on the *training* topics:
  against ``instruct`` it separates what the head failed to learn from what it fails to generalise.

Tables (one engine per system, a warm-up request first, wall time over new tokens):

1. greedy, batch 1: tokens/s, ratio to plain decoding, mean acceptance length (1 + accepted drafts per
   verification step), per-position acceptance rates, and the requests whose tokens differ from plain
   decoding (must be 0: greedy speculation is lossless) — EAGLE-3 at every ``--ks``, ngram and suffix;
2. greedy, batch 8 (all prompts of a set in one ``generate``): tokens/s against plain;
3. temperature 0.8 (``--seeds`` seeded runs), batch 1, sampled drafts: standard against lossless block
   verification (``rejection_sample_method`` ``standard`` / ``block``), where block verification can
   gain, with the per-seed spread as the noise floor.

Run after ``spec-backend train-eagle3`` (``make -C training/probes eagle3-smollm2``):
``python training/probes/bench_eagle3_smollm2.py --head ~/.cache/spec_backend/smollm2-eagle3``.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from dataclasses import dataclass
from typing import Any

CHAT = [
    "Write a short poem about autumn leaves.",
    "What are three tips for sleeping better?",
    "Explain in simple words why the sky is blue.",
    "Give me a recipe idea for a quick vegetarian dinner.",
    "What is the difference between a list and a tuple in Python?",
    "Describe the water cycle in a few sentences.",
    "Suggest a name for a friendly robot and explain why.",
    "How do I stay motivated when learning a new language?",
]


#: the default prompt sets, none trained on; ``TRAINED`` is the control set drawn from the training topics
SETS = ("code-edit", "chat", "instruct", "source")
TRAINED = "instruct-trained"


@dataclass
class Result:
    """One system on one prompt set."""

    ids: list[list[int]]
    tokens_per_s: float
    acceptance_length: float
    per_position: list[float]


def source_prompts(n: int) -> list[str]:
    from spec_backend_train import corpus

    prompts: list[str] = []
    for doc in corpus.documents():
        if doc.held_out:
            prompts += [chat[0]["content"][:600] for chat in corpus.conversations(doc)][:1]
        if len(prompts) >= n:
            break
    return prompts


def measure(llm: Any, prompts: list[str], params: Any, batch: int) -> Result:
    """Generate ``prompts`` ``batch`` at a time; tokens/s and the acceptance counters of this call."""
    chats = [llm.chat_prompt(p) for p in prompts]
    llm.generate(chats[:1], params)  # warm-up
    before = copy.deepcopy(llm.metrics.total)
    outputs: list[list[int]] = []
    start = time.perf_counter()
    for i in range(0, len(chats), batch):
        outputs += [list(o.outputs[0].token_ids) for o in llm.generate(chats[i : i + batch], params)]
    elapsed = time.perf_counter() - start
    after = llm.metrics.total
    steps = after.num_drafts - before.num_drafts
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    n = len(after.accepted_per_position)
    old = (before.accepted_per_position + [0] * n)[:n]
    per_position = [
        (a - b) / steps if steps else 0.0 for a, b in zip(after.accepted_per_position, old, strict=True)
    ]
    length = 1 + accepted / steps if steps else 1.0
    return Result(outputs, sum(map(len, outputs)) / elapsed, length, per_position)


def engines(head: str, ks: list[int], quantization: str | None) -> dict[str, Any]:
    from spec_backend import LLM

    eagle3 = {"method": "eagle3", "model": head, "quantization": quantization}
    systems: dict[str, dict[str, Any] | None] = {"plain": None}
    for k in ks:
        systems[f"eagle3 K={k}"] = {**eagle3, "num_speculative_tokens": k}
    if quantization is not None:  # the same head unquantized, for comparison
        systems["eagle3 K=3 float head"] = {**eagle3, "num_speculative_tokens": 3, "quantization": None}
    systems["ngram K=3"] = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    systems["suffix K=3"] = {"method": "suffix", "num_speculative_tokens": 3}
    for mode in ("standard", "block"):
        systems[f"eagle3 K=3 {mode}"] = {
            **eagle3,
            "num_speculative_tokens": 3,
            "rejection_sample_method": mode,
        }
    return {
        name: LLM("smollm2", speculative_config=spec, max_num_seqs=8, log_stats_interval=None)
        for name, spec in systems.items()
    }


def row(set_name: str, name: str, result: Result, base: Result, differ: int | str) -> str:
    rates = " ".join(f"{r:.2f}" for r in result.per_position) or "-"
    return (
        f"| {set_name} | {name} | {result.tokens_per_s:.2f} | {result.tokens_per_s / base.tokens_per_s:.2f}x "
        f"| {result.acceptance_length:.2f} | {rates} | {differ} |"
    )


def greedy_tables(llms: dict[str, Any], sets: dict[str, list[str]], max_tokens: int) -> None:
    from spec_backend import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    names = [n for n in llms if not n.endswith(("standard", "block"))]
    for batch in (1, 8):
        print(f"\ngreedy, batch {batch}\n")
        print("| set | system | tok/s | vs plain | acceptance length | per position | differ |")
        print("|---|---|---:|---:|---:|---|---:|")
        for set_name, prompts in sets.items():
            base = measure(llms["plain"], prompts, params, batch)
            print(row(set_name, "plain", base, base, 0))
            for name in names[1:] if batch == 1 else ["eagle3 K=3", "ngram K=3", "suffix K=3"]:
                result = measure(llms[name], prompts, params, batch)
                differ = sum(a != b for a, b in zip(result.ids, base.ids, strict=True))
                print(row(set_name, name, result, base, differ), flush=True)


def sampled_table(llms: dict[str, Any], sets: dict[str, list[str]], max_tokens: int, seeds: int) -> None:
    """Standard against block verification at temperature 0.8, each over ``seeds`` seeded runs of every
    prompt: acceptance length pooled over all runs, with the spread (standard deviation) of the
    per-seed values as the noise floor a difference must clear."""
    from statistics import mean, stdev

    from spec_backend import SamplingParams

    print(f"\ntemperature 0.8 (seeds 7..{6 + seeds}), batch 1, sampled drafts\n")
    print("| set | system | tok/s | vs plain | acceptance length | per-seed sd | per position |")
    print("|---|---|---:|---:|---:|---:|---|")
    for set_name in [name for name in ("chat", "instruct") if name in sets]:
        runs: dict[str, list[Result]] = {}
        for name in ("plain", "eagle3 K=3 standard", "eagle3 K=3 block"):
            runs[name] = [
                measure(
                    llms[name],
                    sets[set_name],
                    SamplingParams(temperature=0.8, seed=7 + i, max_tokens=max_tokens),
                    1,
                )
                for i in range(seeds)
            ]
        base = mean(r.tokens_per_s for r in runs["plain"])
        for name, results in runs.items():
            lengths = [r.acceptance_length for r in results]
            rates = " ".join(f"{mean(x):.2f}" for x in zip(*(r.per_position for r in results), strict=True))
            spread = f"{stdev(lengths):.2f}" if len(lengths) > 1 else "-"
            speed = mean(r.tokens_per_s for r in results)
            print(
                f"| {set_name} | {name} | {speed:.2f} | {speed / base:.2f}x | {mean(lengths):.2f} | {spread} "
                f"| {rates or '-'} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--head", required=True, help="the trained head's folder (speculators format)")
    parser.add_argument("--ks", default="1,2,3,5", help="EAGLE-3 draft lengths for the greedy table")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--n", type=int, default=8, help="prompts per set")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--seeds", type=int, default=3, help="seeded runs per prompt at temperature 0.8 (0: no such table)"
    )
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, from {[*SETS, TRAINED]}")
    parser.add_argument(
        "--head-quantization",
        default="int4",
        choices=["int8", "int4", "none"],
        help="speculative_config['quantization'] for the head's weights (drafts only: output unchanged); "
        "int4 runs the head's first layer as one native call on AVX512-VNNI CPUs",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from spec_backend_train.prompts import instruction_prompts

    from spec_backend.tools.prompts import code_edit_prompts

    torch.set_num_threads(args.threads)
    ks = sorted({int(k) for k in args.ks.split(",")} | {3})
    quantization = None if args.head_quantization == "none" else args.head_quantization
    llms = engines(args.head, ks, quantization)
    chosen = args.sets.split(",")
    unknown = sorted(set(chosen) - {*SETS, TRAINED})
    if unknown:
        parser.error(f"unknown --sets {unknown}; allowed: {[*SETS, TRAINED]}")
    makers = {
        "code-edit": lambda: code_edit_prompts(args.n),
        "chat": lambda: CHAT[: args.n],
        "instruct": lambda: instruction_prompts(held_out=True)[: args.n],
        "source": lambda: source_prompts(args.n),
        TRAINED: lambda: instruction_prompts(held_out=False)[: args.n],
    }
    sets = {name: makers[name]() for name in chosen}
    print(
        f"SmolLM2-135M-Instruct (bundled GGUF; Q4_1 layers packed as int4 unless SPEC_BACKEND_INT4=0), "
        f"head {args.head} ({args.head_quantization} weights), {args.max_tokens} new tokens, "
        f"{args.n} prompts per set, {args.threads} threads, torch {torch.__version__}"
    )
    greedy_tables(llms, sets, args.max_tokens)
    if args.seeds > 0:
        sampled_table(llms, sets, args.max_tokens, args.seeds)


if __name__ == "__main__":
    main()
