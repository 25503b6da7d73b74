"""Demo: SmolLM2 with plain decoding and model-free drafters side by side, greedy, code-edit and chat.

Each method gets its own engine over the same model; every prompt runs alone (batch 1, the latency case
speculative decoding is for) on each engine in turn, so a change of load on the machine hits every
method alike. Prints plain decoding's texts, then per method and per kind of prompt (code edits, whose
answers copy from the question, and open chat, whose answers do not) the decode rate (tokens after the
first over the time after the first: the prefill, the same for every method, left out), the speed-up
over plain decoding and the mean acceptance length, and a sentence for each drafter and kind saying
whether speculation paid there. Greedy speculation is lossless, so every method's texts must equal plain
decoding's; the command fails otherwise. Run with ``spec-backend demo`` or ``python -m
spec_backend.tools.demo``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

#: Prompts whose answers copy little from the question (where n-gram drafting has little to find).
CHAT_PROMPTS = ("Give me three tips for writing clear emails.", "Explain what a rainbow is to a child.")


def drafter_specs(k: int, fixed: bool = False) -> dict[str, dict[str, Any] | None]:
    """``speculative_config`` per method shown (``None``: plain decoding). Each drafter runs with the
    engine's default, the draft length chosen per step (``adaptive_draft_length``); ``fixed`` adds it again
    drafting ``k`` every step (``<name>+fixed``)."""
    drafters: dict[str, dict[str, Any]] = {
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        },
        "suffix": {"method": "suffix", "num_speculative_tokens": k},
    }
    if fixed:
        drafters |= {f"{n}+fixed": {**s, "adaptive_draft_length": False} for n, s in list(drafters.items())}
    return {"plain": None, **drafters}


def add_demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="model folder, .gguf file, or 'smollm2' (bundled)")
    p.add_argument("--num-prompts", type=int, default=4, help="code-edit prompts (plus the chat prompts)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--num-speculative-tokens", type=int, default=4, help="K, draft tokens per step")
    p.add_argument(
        "--fixed-draft-length",
        action="store_true",
        help="also each drafter with adaptive_draft_length off (K drafts every step)",
    )


#: the kinds of prompt the demo reports apart (module docstring)
KINDS = ("code edit", "open chat")
#: below this speed-up a drafter is reported as not paying
PAYS = 1.05


@dataclass
class Tally:
    """One method's decode tokens, decode seconds and steps on one kind of prompt."""

    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0

    def add(self, output: Any) -> None:
        metrics = output.metrics
        if metrics is None or metrics.first_token_time is None or metrics.last_token_time is None:
            return
        self.tokens += max(len(output.outputs[0].token_ids) - 1, 0)
        self.seconds += metrics.last_token_time - metrics.first_token_time
        self.steps += output.num_steps

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_length(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


def _interleaved(engines: dict[str, Any], prompts: list[tuple[str, str]], max_tokens: int) -> dict[str, Any]:
    """Each prompt on each engine in turn; per method its outputs and ``Tally`` per kind of prompt."""
    from spec_backend.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    result: dict[str, Any] = {name: ([], {kind: Tally() for kind in KINDS}) for name in engines}
    for llm in engines.values():
        llm.generate([prompts[0][1]], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    for kind, prompt in prompts:
        for name, llm in engines.items():
            out = llm.generate([prompt], params)[0]
            result[name][0].append(out)
            result[name][1][kind].add(out)
    return result


def run_demo(args: argparse.Namespace) -> int:
    """Load the model once per method, generate greedily, print the texts and a comparison."""
    from spec_backend.backends.base import BackendError
    from spec_backend.engine import LLM
    from spec_backend.tools.errors import fail
    from spec_backend.tools.prompts import code_edit_prompts

    messages = [*code_edit_prompts(args.num_prompts), *CHAT_PROMPTS]
    kinds = [KINDS[0]] * args.num_prompts + [KINDS[1]] * len(CHAT_PROMPTS)
    engines = {}
    for name, spec in drafter_specs(args.num_speculative_tokens, args.fixed_draft_length).items():
        print(f"loading {args.model} with speculative_config={spec} ...", flush=True)
        try:
            engines[name] = LLM(args.model, speculative_config=spec, log_stats_interval=None)
        except (ValueError, BackendError, OSError) as exc:
            return fail(exc)
    plain = engines["plain"]
    results = _interleaved(
        engines, list(zip(kinds, [plain.chat_prompt(m) for m in messages], strict=True)), args.max_tokens
    )
    texts = {
        name: [o.outputs[0].text if o.outputs[0].finish_reason != "error" else None for o in outs]
        for name, (outs, _) in results.items()
    }
    _print_texts(messages, results["plain"][0])
    _print_table(results, texts)
    return 0 if all(t == texts["plain"] for t in texts.values()) else 1


def _print_table(results: dict[str, Any], texts: dict[str, list[str | None]]) -> None:
    base = results["plain"][1]
    print("batch 1, greedy; decode tokens/s (after each prompt's first token: prefills left out)")
    head = "".join(f" | {kind:>9} {'vs plain':>8} {'accept':>6}" for kind in KINDS)
    width = max(8, *(len(name) for name in results))
    print(f"{'method':<{width}}{head} | same text as plain")
    for name, (_, tallies) in results.items():
        cells = "".join(
            f" | {t.rate:>9.2f} {t.rate / base[k].rate if base[k].rate else 0.0:>7.2f}x "
            f"{f'{t.acceptance_length:.2f}' if name != 'plain' else '-':>6}"
            for k, t in tallies.items()
        )
        print(f"{name:<{width}}{cells} | {'yes' if texts[name] == texts['plain'] else 'NO'}")
    for name, (_, tallies) in results.items():
        if name == "plain":
            continue
        for kind, tally in tallies.items():
            gain = tally.rate / base[kind].rate if base[kind].rate else 0.0
            verdict = "pays" if gain >= PAYS else "does not pay"
            print(f"{name} on {kind}: speculation {verdict} here ({gain:.2f}x plain decoding)")


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
