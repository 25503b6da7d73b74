"""Adaptive drafting against plain decoding and fixed drafting on the demo's prompt sets, in one run.

    .venv/bin/python benchmarks/bench_adaptive.py [--isa avx2] [--passes 3] [--max-tokens 96] [--k 4]
                                                  [--lockstep]

Per pass, a fresh engine per method (suffix's response cache would otherwise see each answer again) runs
every prompt alone (batch 1, greedy), the methods interleaved prompt by prompt so a change of load hits
them alike: plain decoding; ``ngram, off``, the n-gram engine with speculation off (``set_speculation``:
every step drafts for no request, the step adaptive drafting takes when it chooses plain decoding); ngram
and suffix at ``K``; and both with ``adaptive_draft_length``. The demo's two kinds of prompt are reported
apart: code edits (answers that copy from the question) and open chat (answers that do not). Each cell is
the median over passes of the decode rate (tokens after the first over the time after the first), and
the median, min and max over passes of its ratio to plain decoding's rate in the same pass (engines built
anew differ by a few percent from one another on a VM: their memory lands elsewhere, so the ratios of one
pass are noisy and their median over passes is what to quote). ``plain, again`` is a second plain engine,
the negative control: its ratio to plain measures that spread, the noise floor of every other row. Pass
``i`` builds and runs the engines in the listed order rotated by ``i``, so no method is always built or
run first (an engine built first or run first can read a few percent faster or slower for that alone).
With ``--lockstep`` the engines take one prompt together and step in turn, one engine step each, every
step timed on its own: a method's rate is its decode tokens over the summed time of its decode steps
(every step after the one that prefilled), so a drift of the machine's speed (this VM's read 145 and
205 tok/s minutes apart in one process) lands on every method within a step's time instead of within a
prompt's. Greedy speculation is lossless, so every text must equal plain decoding's (the script fails
otherwise). The CPU's ISA flags are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any


def methods(k: int) -> dict[str, tuple[dict[str, Any] | None, bool]]:
    """name -> (speculative_config, speculation on)."""
    from spec_backend.tools.demo import drafter_specs

    specs = drafter_specs(k, fixed=True)  # "ngram": the default (adaptive); "ngram+fixed": K every step
    names = {
        "ngram": "ngram+fixed",
        "ngram+adaptive": "ngram",
        "suffix": "suffix+fixed",
        "suffix+adaptive": "suffix",
    }
    return {
        "plain": (None, True),
        "plain, again": (None, True),
        "ngram, off": (specs["ngram+fixed"], False),
        **{name: (specs[spec], True) for name, spec in names.items()},
    }


def one_pass(
    prompt_sets: dict[str, list[str]], k: int, max_tokens: int, rotation: int = 0, lockstep: bool = False
) -> dict[str, dict[str, float]]:
    """Fresh engines, each prompt on each in turn (or, ``lockstep``, on all together, a step each in
    turn): name -> kind -> decode tokens per second. The engines are built, and run on each prompt, in
    the methods' order rotated by ``rotation`` (the module docstring)."""
    from spec_backend.engine import LLM, SamplingParams
    from spec_backend.tools.demo import Tally

    order = list(methods(k).items())
    order = order[rotation % len(order) :] + order[: rotation % len(order)]
    engines = {}
    for name, (spec, on) in order:
        engines[name] = LLM("smollm2", speculative_config=spec, log_stats_interval=None)
        if spec is not None:
            engines[name].set_speculation(on)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    warm = SamplingParams(temperature=0.0, max_tokens=4)
    texts: dict[str, list[str]] = {name: [] for name in engines}
    tallies = {name: {kind: Tally() for kind in prompt_sets} for name in engines}
    for llm in engines.values():
        llm.generate([next(iter(prompt_sets.values()))[0]], warm)
    for kind, prompts in prompt_sets.items():
        for prompt in prompts:
            if lockstep:
                for name, (text, tokens, seconds) in in_lockstep(engines, prompt, params).items():
                    texts[name].append(text)
                    tallies[name][kind].tokens += tokens
                    tallies[name][kind].seconds += seconds
                continue
            for name, llm in engines.items():
                out = llm.generate([prompt], params)[0]
                texts[name].append(out.outputs[0].text)
                tallies[name][kind].add(out)
    return _checked(texts, tallies)


#: ``in_lockstep``'s per-step callback: (engine name, its LLM, its request, the request's tokens before the
#: step, the drafts pending before it, the step's seconds)
StepObserver = Callable[[str, Any, Any, int, int, float], None]


def in_lockstep(
    engines: dict[str, Any], prompt: str, params: Any, observe: StepObserver | None = None
) -> dict[str, tuple[str, int, float]]:
    """``prompt`` on every engine at once, one engine step each in turn: name -> (text, decode tokens,
    seconds of its decode steps). A step is a decode step when its request already had a token;
    ``observe`` is called after each one."""
    import time

    from spec_backend.engine.request import merge_samples

    requests = {}
    for name, llm in engines.items():
        llm.engine.ensure_idle()
        requests[name] = llm.make_requests([prompt], params)
        for request in requests[name]:
            llm.engine.add(request)
    seconds = dict.fromkeys(engines, 0.0)
    while any(llm.engine.has_unfinished() for llm in engines.values()):
        for name, llm in engines.items():
            if not llm.engine.has_unfinished():
                continue
            request = requests[name][0]
            before, drafts = len(request.output_token_ids), llm.engine.pending.total
            start = time.perf_counter()
            llm.engine.step()
            if before:  # a decode step
                took = time.perf_counter() - start
                seconds[name] += took
                if observe is not None:
                    observe(name, llm, request, before, drafts, took)
    result = {}
    for name, llm in engines.items():
        out = merge_samples(requests[name], llm.tokenizer)[0].outputs[0]
        result[name] = (out.text, max(len(out.token_ids) - 1, 0), seconds[name])
    return result


def _checked(texts: dict[str, list[str]], tallies: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    wrong = [name for name, t in texts.items() if t != texts["plain"]]
    if wrong:
        raise SystemExit(f"greedy texts differ from plain decoding's: {wrong}")
    return {name: {kind: t.rate for kind, t in by_kind.items()} for name, by_kind in tallies.items()}


def isa_line(cap: str) -> str:
    """The CPU's SIMD flags, the kernels' cap (``--isa``) and the cores: every CPU figure names its ISA."""
    from spec_backend.cpu.isa import cpu_flags

    flags = sorted(f for f in cpu_flags() if f.startswith(("avx", "fma", "amx", "asimd")))
    return f"CPU flags: {' '.join(flags)}; kernels capped to: {cap}; {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--isa", choices=("avx2", "avx512", "native"), default="native")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--code-prompts", type=int, default=4)
    p.add_argument("--lockstep", action="store_true", help="the engines step in turn (module docstring)")
    args = p.parse_args(argv)
    if args.isa != "native":
        os.environ["SPEC_BACKEND_ISA"] = args.isa
    from spec_backend.engine import LLM
    from spec_backend.tools.demo import CHAT_PROMPTS
    from spec_backend.tools.prompts import code_edit_prompts

    chat_template = LLM("smollm2", log_stats_interval=None).chat_prompt
    prompt_sets = {
        "code edit": [chat_template(m) for m in code_edit_prompts(args.code_prompts)],
        "open chat": [chat_template(m) for m in CHAT_PROMPTS],
    }
    passes = [one_pass(prompt_sets, args.k, args.max_tokens, i, args.lockstep) for i in range(args.passes)]
    print(isa_line(args.isa))
    mode = "engines in lockstep" if args.lockstep else "engines in turn per prompt"
    setup = f"batch 1, greedy, K={args.k}, {args.max_tokens} tokens, {args.passes} passes, {mode}"
    print(f"{setup}: the median rate")
    print("(tokens/s) and the median, min and max over passes of the ratio to plain decoding in that pass")
    kinds = list(prompt_sets)
    print(f"{'method':<16} | " + " | ".join(f"{kind:>30}" for kind in kinds))
    for name in methods(args.k):
        cells = []
        for kind in kinds:
            ratios = [r[name][kind] / r["plain"][kind] for r in passes]
            rate = statistics.median(r[name][kind] for r in passes)
            spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
            cells.append(f"{rate:7.2f} {statistics.median(ratios):.3f}x ({spread})")
        print(f"{name:<16} | " + " | ".join(f"{c:>30}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
