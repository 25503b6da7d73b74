"""A trained EAGLE-3 head on the bundled SmolLM2 against plain decoding, ngram and suffix, one run.

Prompt sets (chat template, greedy, batch 1, ``--max-tokens`` new tokens):

* ``code-edit`` — the e2e benchmark's copy-heavy prompts (n-gram drafting's home ground);
* ``chat`` — open questions whose answers copy nothing from the prompt (handwritten, never trained on);
* ``held-out`` — the user turns of corpus chats from files held out of training (``training.corpus``).

Per set and system: tokens/s (new tokens over wall time, a warm-up request first), the ratio to plain
decoding, the mean acceptance length (1 + accepted drafts per verification step) and the number of
requests whose tokens differ from plain decoding (must be 0: greedy is lossless). Run after
``spec-backend train-eagle3``: ``python benchmarks/bench_eagle3_smollm2.py --head DIR``.
"""

from __future__ import annotations

import argparse
import os
import time
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


def held_out_prompts(tokenizer: Any, n: int) -> list[str]:
    from spec_backend.training import corpus

    prompts: list[str] = []
    for doc in corpus.documents():
        if doc.held_out:
            prompts += [chat[0]["content"][:600] for chat in corpus.conversations(doc)][:1]
        if len(prompts) >= n:
            break
    return prompts


def run(llm: Any, prompts: list[str], max_tokens: int) -> tuple[list[list[int]], float, float]:
    """(token ids per prompt, tokens/s, mean acceptance length) for ``prompts`` one at a time."""
    from spec_backend import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.generate([llm.chat_prompt(prompts[0])], params)  # warm-up
    before = llm.metrics.total
    drafts0, accepted0 = before.num_drafts, before.num_accepted_tokens
    outputs, tokens, start = [], 0, time.perf_counter()
    for prompt in prompts:
        ids = llm.generate([llm.chat_prompt(prompt)], params)[0].outputs[0].token_ids
        outputs.append(ids)
        tokens += len(ids)
    elapsed = time.perf_counter() - start
    total = llm.metrics.total
    steps = total.num_drafts - drafts0
    length = 1 + (total.num_accepted_tokens - accepted0) / steps if steps else 1.0
    return outputs, tokens / elapsed, length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--head", required=True, help="the trained head (speculators format)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--n", type=int, default=8, help="prompts per set")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from spec_backend import LLM
    from spec_backend.engine.prompts import code_edit_prompts

    torch.set_num_threads(args.threads)
    k = args.k
    systems = {
        "plain": None,
        f"eagle3 K={k}": {"method": "eagle3", "model": args.head, "num_speculative_tokens": k},
        f"ngram K={k}": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3},
        f"suffix K={k}": {"method": "suffix", "num_speculative_tokens": k},
    }
    llms = {
        name: LLM("smollm2", speculative_config=spec, log_stats_interval=None)
        for name, spec in systems.items()
    }
    tokenizer = llms["plain"].tokenizer
    sets = {
        "code-edit": code_edit_prompts(args.n),
        "chat": CHAT[: args.n],
        "held-out": held_out_prompts(tokenizer, args.n),
    }
    print(
        f"SmolLM2-135M-Instruct (bundled GGUF, float32), greedy, batch 1, {args.max_tokens} new tokens, "
        f"{args.threads} threads, torch {torch.__version__}"
    )
    print(f"{'set':<10} {'system':<14} {'tok/s':>7} {'vs plain':>9} {'accept len':>11} {'differ':>7}")
    for set_name, prompts in sets.items():
        base_ids, base_tps, _ = run(llms["plain"], prompts, args.max_tokens)
        for name, llm in llms.items():
            ids, tps, length = (
                (base_ids, base_tps, 1.0) if name == "plain" else run(llm, prompts, args.max_tokens)
            )
            differ = sum(a != b for a, b in zip(ids, base_ids, strict=True))
            print(
                f"{set_name:<10} {name:<14} {tps:>7.2f} {tps / base_tps:>8.2f}x {length:>11.2f} {differ:>7}"
            )


if __name__ == "__main__":
    main()
