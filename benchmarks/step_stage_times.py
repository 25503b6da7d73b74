"""Host time of a decode step's stages, plain decoding against the n-gram engine with speculation off and
with adaptive drafting (the default), on the demo's open-chat prompts in one process.

    .venv/bin/python benchmarks/step_stage_times.py [--rounds 3] [--method ngram] [--isa avx2]

The engines take each prompt together and step in turn (``bench_adaptive.in_lockstep``), so the
machine's drift lands on all of them within a step. Each engine's own stepper and runner are wrapped
with timers (instance attributes, as ``spec_backend.testing.host_reads.wrapped_decode`` does; nothing in
the package changes): ``step`` (``EngineCore.step``), ``forward`` (the target's forward), ``accept``
(the accepted tokens' bookkeeping, draft-next included) and ``draft-next`` (the policy and the drafter).
Per engine: µs per step of each stage (prefills included), steps, and the adaptive engine's held steps.
Read the differences to plain decoding: the VM's speed moves between runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STAGES = ("step", "forward", "accept", "draft-next")


def _timed(seconds: dict[str, float], stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[stage] += time.perf_counter() - start

    return timed


def instrument(llm: Any) -> tuple[dict[str, float], list[int]]:
    """Timers on ``llm``'s stages (instance attributes); the seconds by stage and a one-item step count."""
    seconds, steps = dict.fromkeys(STAGES, 0.0), [0]
    engine, stepper = llm.engine, llm.engine.stepper
    step = _timed(seconds, "step", engine.step)

    def counted() -> Any:
        steps[0] += 1
        return step()

    engine.step = counted
    engine.runner.forward = _timed(seconds, "forward", engine.runner.forward)
    stepper._accept = _timed(seconds, "accept", stepper._accept)
    stepper._draft_next = _timed(seconds, "draft-next", stepper._draft_next)
    return seconds, steps


def _held(llm: Any) -> int:
    """The engine's held steps so far (0 without adaptive drafting, or on a tree older than held steps)."""
    return int(getattr(llm.engine.adaptive, "held_steps", 0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--method", choices=("ngram", "suffix"), default="ngram")
    p.add_argument("--isa", choices=("avx2", "avx512", "native"), default="native")
    p.add_argument("--max-tokens", type=int, default=96)
    args = p.parse_args(argv)
    if args.isa != "native":
        os.environ["SPEC_BACKEND_ISA"] = args.isa
    from bench_adaptive import in_lockstep, isa_line

    from spec_backend.engine import LLM, SamplingParams
    from spec_backend.tools.demo import CHAT_PROMPTS, drafter_specs

    specs = drafter_specs(4, fixed=True)
    engines = {
        "plain": LLM("smollm2", log_stats_interval=None),
        f"{args.method}, off": LLM("smollm2", speculative_config=specs[f"{args.method}+fixed"]),
        f"{args.method}, adaptive": LLM("smollm2", speculative_config=specs[args.method]),
    }
    engines[f"{args.method}, off"].set_speculation(False)
    prompts = [engines["plain"].chat_prompt(m) for m in CHAT_PROMPTS]
    for llm in engines.values():
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4))
    timers = {name: instrument(llm) for name, llm in engines.items()}
    held = {name: _held(llm) for name, llm in engines.items()}
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for _ in range(args.rounds):
        for prompt in prompts:
            in_lockstep(engines, prompt, params)
    print(isa_line(args.isa))
    print(f"open chat x{args.rounds}, batch 1, greedy, K=4: host us per step by stage")
    print(f"{'engine':18} " + " ".join(f"{s:>10}" for s in STAGES) + "      steps   held")
    for name, llm in engines.items():
        seconds, (steps,) = timers[name]
        now_held = _held(llm) - held[name]
        cells = " ".join(f"{1e6 * seconds[s] / steps:10.1f}" for s in STAGES)
        print(f"{name:18} {cells} {steps:10d} {now_held:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
