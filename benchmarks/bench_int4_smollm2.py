"""The bundled SmolLM2 (Q4_1 GGUF) with its Q4_1 layers packed (int4 kernel) against the de-quantized
float32 model, in one run: numerics (max logit difference and argmax agreement along the float model's
greedy continuations, identical greedy outputs) and batch-1 decode speed (plain, and ngram K=4 on the
packed model), interleaved prompt by prompt so load changes hit every system alike.

Run: ``python benchmarks/bench_int4_smollm2.py --threads 2 --max-tokens 64 --prompts 8``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any


def load(packed: bool, spec: dict[str, Any] | None) -> Any:
    from spec_backend import LLM

    os.environ["SPEC_BACKEND_INT4"] = "1" if packed else "0"
    try:
        return LLM("smollm2", speculative_config=spec, log_stats_interval=None)
    finally:
        os.environ.pop("SPEC_BACKEND_INT4")


def numerics(
    float_llm: Any, packed_llm: Any, ids: list[list[int]], outs: list[list[int]]
) -> dict[str, float]:
    """Teacher-forced along the float model's greedy output: logit differences and argmax agreement."""
    import torch

    diffs, agree, total = [], 0, 0
    for llm in (float_llm, packed_llm):  # plain transformers forwards (the engine's attention needs a step)
        llm.model.set_attn_implementation("sdpa")
    for prompt, out in zip(ids, outs, strict=True):
        x = torch.tensor([prompt + out])
        with torch.inference_mode():
            a = float_llm.model(x).logits[0, len(prompt) - 1 : -1].float()  # [T, V]
            b = packed_llm.model(x).logits[0, len(prompt) - 1 : -1].float()
        diffs.append(float((a - b).abs().max()))
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
    return {
        "max_logit_diff": max(diffs),
        "median_prompt_max_diff": statistics.median(diffs),
        "argmax_agreement": agree / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args()
    import torch

    from spec_backend import SamplingParams
    from spec_backend.tools.prompts import code_edit_prompts

    torch.set_num_threads(args.threads)
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    systems = {"float32 plain": load(False, ngram), "int4 plain": load(True, ngram), "int4 ngram K=4": None}
    systems["int4 ngram K=4"] = systems["int4 plain"]
    first = systems["float32 plain"]
    ids = [first.tokenizer(first.chat_prompt(m))["input_ids"] for m in code_edit_prompts(args.prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for llm in (systems["float32 plain"], systems["int4 plain"]):  # warm-up
        llm.generate([ids[0]], SamplingParams(temperature=0.0, max_tokens=4))
    rates: dict[str, list[float]] = {name: [] for name in systems}
    outputs: dict[str, list[list[int]]] = {name: [] for name in systems}
    for prompt in ids:
        for name, llm in systems.items():
            llm.set_speculation(name.endswith("K=4"))
            start = time.perf_counter()
            out = llm.generate([prompt], params)[0].outputs[0].token_ids
            rates[name].append(len(out) / (time.perf_counter() - start))
            outputs[name].append(out)
    base = statistics.median(rates["float32 plain"])
    print(
        f"SmolLM2 Q4_1, {len(ids)} code-edit prompts, greedy, {args.max_tokens} new tokens, "
        f"{args.threads} threads"
    )
    for name, values in rates.items():
        same = sum(a == b for a, b in zip(outputs[name], outputs["float32 plain"], strict=True))
        print(
            f"{name:<16} median {statistics.median(values):6.2f} tok/s  (min {min(values):6.2f}, max "
            f"{max(values):6.2f})  x{statistics.median(values) / base:4.2f}  "
            f"outputs equal to float32: {same}/{len(ids)}"
        )
    stats = numerics(systems["float32 plain"], systems["int4 plain"], ids, outputs["float32 plain"])
    print(
        f"packed vs float32, teacher-forced on the float model's outputs: max |logit diff| "
        f"{stats['max_logit_diff']:.4f} (median over prompts {stats['median_prompt_max_diff']:.4f}), "
        f"argmax agreement {stats['argmax_agreement']:.4f}"
    )
    spec_equal = outputs["int4 ngram K=4"] == outputs["int4 plain"]
    print(f"int4 ngram output equals int4 plain output: {spec_equal}")


if __name__ == "__main__":
    main()
