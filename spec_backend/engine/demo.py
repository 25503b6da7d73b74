"""Demo: SmolLM2 edits code with n-gram speculation (K=4); prints texts, tokens/s and acceptance.

Run with ``spec-backend demo`` or ``python -m spec_backend.engine.demo``.
"""

from __future__ import annotations

import argparse
import sys
import time


def add_demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="model folder, .gguf file, or 'smollm2' (bundled)")
    p.add_argument("--num-prompts", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--num-speculative-tokens", type=int, default=4)


def run_demo(args: argparse.Namespace) -> int:
    """Load the model, generate greedily for a few code-edit prompts, print results and statistics."""
    from spec_backend.backends.base import BackendError
    from spec_backend.engine import LLM, SamplingParams
    from spec_backend.engine.cli import fail, summary_table
    from spec_backend.engine.prompts import code_edit_prompts

    spec = {
        "method": "ngram",
        "num_speculative_tokens": args.num_speculative_tokens,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    print(f"loading {args.model} with speculative_config={spec} ...", flush=True)
    try:
        llm = LLM(args.model, speculative_config=spec, log_stats_interval=None)
    except (ValueError, BackendError, OSError) as exc:
        return fail(exc)
    messages = code_edit_prompts(args.num_prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate([llm.chat_prompt(messages[0])], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    start = time.perf_counter()
    outputs = llm.generate([llm.chat_prompt(m) for m in messages], params)
    seconds = time.perf_counter() - start
    for message, out in zip(messages, outputs, strict=True):
        c = out.outputs[0]
        print("=" * 80)
        print(message)
        print("-" * 32 + " SmolLM2 " + "-" * 39)
        print(c.text if c.finish_reason != "error" else f"[error] {c.error}")
        stats = out.spec_stats
        print(
            f"[{len(c.token_ids)} tokens, finish_reason={c.finish_reason}, "
            f"acceptance length {stats.mean_acceptance_length:.2f}]"
        )
    print("=" * 80)
    print(summary_table(outputs, seconds))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spec_backend.engine.demo", description=__doc__)
    add_demo_args(parser)
    return run_demo(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
