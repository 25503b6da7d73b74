"""Where adaptive drafting's time goes on the demo's prompts: its decode steps by kind, against plain
decoding's steps in the same process.

    .venv/bin/python benchmarks/bench_step_kinds.py [--method suffix] [--rounds 1] [--isa avx2] [--warm]
                                                    [--no-profile]

A plain engine and a speculative one (``--method`` ngram or suffix, adaptive drafting on: the default) take
each open-chat prompt of ``make demo`` together and step in turn, one engine step each, every step timed alone
(``bench_adaptive.in_lockstep``'s way, so the machine's drift lands on both within a step). With ``--warm``
both first run the benchmark's code-edit prompts one at a time, untimed: the order of ``bench_adaptive.py``,
which leaves the policy's measurements and acceptance primed by code edits. Each speculative decode step is
classed by the drafts it verified (``no drafts``: a plain step the policy decided, ``no drafts, held``: one it
held; ``verify j``: j drafts) and reported as steps, ms a step, that over plain decoding's mean step
(``x plain``), tokens a step and its net gain in plain steps (tokens emitted minus the plain steps its time
would have bought). ``held`` counts the steps the policy held (``AdaptiveDraftLength.hold``). Greedy
speculation is lossless: the texts must equal plain decoding's (the script fails otherwise). The CPU's ISA
flags are printed. ``--no-profile`` drops the engine's start-up cost profile (``engine/cost_profile.py``), so
the policy times drafting online as it did before it: the negative control of the profile.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _step_kinds(
    engines: dict[str, Any], prompts: list[str], params: Any
) -> tuple[dict[str, list[float]], int]:
    """Run ``prompts`` on both engines in lockstep; per kind of speculative step [steps, seconds, tokens]
    (and ``plain``'s), and the held steps."""
    from bench_adaptive import in_lockstep

    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
    adaptive = [llm.engine.adaptive for llm in engines.values() if llm.engine.adaptive is not None]
    start = sum(a.held_steps for a in adaptive)
    seen_held = [start]  # the held steps so far, read after each step to class it

    def observe(name: str, llm: Any, request: Any, before: int, drafts: int, seconds: float) -> None:
        now_held = sum(a.held_steps for a in adaptive)
        was_held, seen_held[0] = now_held > seen_held[0], now_held
        kind = "plain" if name == "plain" else (f"verify {drafts}" if drafts else "no drafts")
        kind = f"{kind}, held" if was_held else kind
        tally = kinds[kind]
        tally[0], tally[1] = tally[0] + 1, tally[1] + seconds
        tally[2] += len(request.output_token_ids) - before

    for prompt in prompts:
        texts = {text for text, _, _ in in_lockstep(engines, prompt, params, observe).values()}
        if len(texts) != 1:
            raise SystemExit(f"greedy texts differ from plain decoding's on {prompt[:40]!r}")
    return kinds, seen_held[0] - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=("ngram", "suffix"), default="ngram")
    p.add_argument("--rounds", type=int, default=1, help="times the chat prompts are run (one engine)")
    p.add_argument("--isa", choices=("avx2", "avx512", "native"), default="native")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--warm", action="store_true", help="run the code-edit prompts first, untimed")
    p.add_argument(
        "--no-profile", action="store_true", help="drop the start-up cost profile: drafting timed online"
    )
    args = p.parse_args(argv)
    if args.isa != "native":
        os.environ["SPEC_BACKEND_ISA"] = args.isa
    from bench_adaptive import isa_line

    from spec_backend.engine import LLM, SamplingParams
    from spec_backend.tools.demo import CHAT_PROMPTS, drafter_specs
    from spec_backend.tools.prompts import code_edit_prompts

    spec = drafter_specs(args.k, fixed=True)[args.method]  # the default: adaptive drafting
    engines = {
        "plain": LLM("smollm2", log_stats_interval=None),
        args.method: LLM("smollm2", speculative_config=spec, log_stats_interval=None),
    }
    adaptive = engines[args.method].engine.adaptive
    if args.no_profile and adaptive is not None:  # the negative control: measured online, as before it
        adaptive.profile = {}
    template = engines["plain"].chat_prompt
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for llm in engines.values():
        llm.generate([template(CHAT_PROMPTS[0])], SamplingParams(temperature=0.0, max_tokens=4))
        if args.warm:
            for prompt in code_edit_prompts(4):
                llm.generate([template(prompt)], params)
    kinds, held = _step_kinds(engines, [template(m) for m in CHAT_PROMPTS] * args.rounds, params)
    print(isa_line(args.isa))
    print(f"open chat x{args.rounds}, batch 1, greedy, K={args.k}, {args.method} adaptive, warm={args.warm}, "
          f"profile={not args.no_profile}")  # fmt: skip
    steps, seconds, _ = kinds.pop("plain")
    mean = seconds / steps
    print(f"plain decoding: {int(steps)} steps, {1e3 * mean:.3f} ms a step")
    total_s = total_t = 0.0
    for kind, (n, s, tokens) in sorted(kinds.items()):
        gain = tokens - s / mean
        print(f"{kind:10} {int(n):5d} steps {1e3 * s / n:7.3f} ms ({s / n / mean:.3f}x plain) "
              f"{tokens / n:.2f} tokens a step, net {gain:+.1f} plain steps")  # fmt: skip
        total_s, total_t = total_s + s, total_t + tokens
    rate = total_t * mean / total_s
    print(f"in all: {int(total_t)} tokens in {total_s / mean:.1f} plain steps' time: {rate:.4f}x plain")
    print(f"held steps: {held}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
