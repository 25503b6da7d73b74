"""Demo: SmolLM2 with plain decoding and model-free drafters side by side, greedy, code-edit and chat.

Each method gets its own engine over the same model and the same prompts, one request at a time (batch
1, the latency case speculative decoding is for): plain decoding first (the reference), then n-gram and
suffix drafting. Prints the reference texts, then one line per method: tokens/s (prefills included),
the speed-up over plain decoding, the mean acceptance length, and whether its texts equal
plain decoding's (greedy speculation is lossless, so they must; the command fails otherwise). Run with
``spec-backend demo`` or ``python -m spec_backend.tools.demo``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

#: Prompts whose answers copy little from the question (where n-gram drafting has little to find).
CHAT_PROMPTS = ("Give me three tips for writing clear emails.", "Explain what a rainbow is to a child.")


def drafter_specs(k: int) -> dict[str, dict[str, Any] | None]:
    """``speculative_config`` per method shown (``None``: plain decoding)."""
    return {
        "plain": None,
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        },
        "suffix": {"method": "suffix", "num_speculative_tokens": k},
    }


def add_demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="model folder, .gguf file, or 'smollm2' (bundled)")
    p.add_argument("--num-prompts", type=int, default=2, help="code-edit prompts (plus the chat prompts)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--num-speculative-tokens", type=int, default=4, help="K, draft tokens per step")


def _run(llm: Any, prompts: list[str], max_tokens: int) -> tuple[list[Any], float]:
    """Each prompt alone (batch 1: the latency case speculative decoding is for); outputs and the summed
    wall time, prefills included."""
    from spec_backend.engine import SamplingParams

    llm.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    outputs, seconds = [], 0.0
    for prompt in prompts:
        start = time.perf_counter()
        outputs += llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens))
        seconds += time.perf_counter() - start
    return outputs, seconds


def run_demo(args: argparse.Namespace) -> int:
    """Load the model once per method, generate greedily, print the texts and a comparison."""
    from spec_backend.backends.base import BackendError
    from spec_backend.engine import LLM
    from spec_backend.tools.errors import fail
    from spec_backend.tools.prompts import code_edit_prompts

    messages = [*code_edit_prompts(args.num_prompts), *CHAT_PROMPTS]
    specs = drafter_specs(args.num_speculative_tokens)
    rows, reference = [], None
    for name, spec in specs.items():
        print(f"loading {args.model} with speculative_config={spec} ...", flush=True)
        try:
            llm = LLM(args.model, speculative_config=spec, log_stats_interval=None)
        except (ValueError, BackendError, OSError) as exc:
            return fail(exc)
        outputs, seconds = _run(llm, [llm.chat_prompt(m) for m in messages], args.max_tokens)
        texts = [o.outputs[0].text if o.outputs[0].finish_reason != "error" else None for o in outputs]
        if reference is None:
            reference = texts
            _print_texts(messages, outputs)
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        rows.append((name, tokens / seconds, llm.metrics.total.mean_acceptance_length, texts == reference))
    base = rows[0][1]
    print("batch 1, greedy, prefills included")
    print(f"{'method':<8} {'tokens/s':>9} {'vs plain':>9} {'acceptance length':>18}  same text as plain")
    for name, speed, length, same in rows:
        accept = f"{length:.2f}" if name != "plain" else "-"
        print(f"{name:<8} {speed:>9.2f} {speed / base:>8.2f}x {accept:>18}  {'yes' if same else 'NO'}")
    return 0 if all(row[3] for row in rows) else 1


def _print_texts(messages: list[str], outputs: list[Any]) -> None:
    for message, out in zip(messages, outputs, strict=True):
        c = out.outputs[0]
        print("=" * 80)
        print(message)
        print("-" * 32 + " SmolLM2 " + "-" * 39)
        print(c.text if c.finish_reason != "error" else f"[error] {c.error}")
    print("=" * 80)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spec_backend.tools.demo", description=__doc__)
    add_demo_args(parser)
    return run_demo(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
