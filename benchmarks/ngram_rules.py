"""Which occurrence should an n-gram draft continue? Ours (``proposers/ngram.py``) takes the most recent
occurrence of the longest matching suffix; vLLM 0.32's ``_find_longest_matched_ngram_and_propose_tokens``
takes the earliest. This replays both rules, and a third (the most recent occurrence, its continuation
repeated past the end of the context: a periodic extension), over the bundled SmolLM2's greedy outputs on
the demo's code-edit and chat prompts, drafting K every step, and prints tokens per verify step (accepted
drafts + 1) and draft rows per step for each rule and lookup window. Offline and exact: the greedy
output is what a lossless verifier emits whatever the drafts, so acceptance is counted against it.

    .venv/bin/python benchmarks/ngram_rules.py [--k 4] [--max-tokens 128] [--code-prompts 8]
"""

from __future__ import annotations

import argparse

RULES = ("recent", "earliest", "periodic")


def match_end(history: list[int], n_min: int, n_max: int, earliest: bool) -> int | None:
    """Where the continuation of the longest matching suffix starts (``s + n``), or None."""
    length = len(history)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = history[length - n :]
        starts = [s for s in range(length - n) if history[s : s + n] == suffix]  # s + n <= length - 1
        if starts:
            return (min(starts) if earliest else max(starts)) + n
    return None


def draft(history: list[int], k: int, rule: str, n_min: int, n_max: int) -> list[int]:
    end = match_end(history, n_min, n_max, rule == "earliest")
    if end is None:
        return []
    if rule == "periodic":  # past the context, the period it found repeats
        period = len(history) - end
        return [history[end + j % period] for j in range(k)]
    return history[end : end + k]


def replay(
    runs: list[tuple[list[int], list[int]]], k: int, rule: str, window: tuple[int, int]
) -> tuple[float, float]:
    """Tokens per step and draft rows per step over ``runs`` (prompt, greedy output)."""
    steps = tokens = rows = 0
    for prompt, out in runs:
        pos = 0
        while pos < len(out):
            drafted = draft(prompt + out[:pos], k, rule, *window)[: max(0, len(out) - pos - 1)]
            accepted = 0
            while accepted < len(drafted) and drafted[accepted] == out[pos + accepted]:
                accepted += 1
            pos, steps, tokens, rows = (
                pos + accepted + 1,
                steps + 1,
                tokens + accepted + 1,
                rows + len(drafted),
            )
    return tokens / steps, rows / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--code-prompts", type=int, default=8)
    args = parser.parse_args(argv)
    from spec_backend.engine import LLM, SamplingParams
    from spec_backend.tools.demo import CHAT_PROMPTS
    from spec_backend.tools.prompts import code_edit_prompts

    llm = LLM("smollm2", log_stats_interval=None)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    sets = {"code edit": code_edit_prompts(args.code_prompts), "open chat": list(CHAT_PROMPTS)}
    print(
        f"SmolLM2-135M greedy, {args.max_tokens} tokens, K={args.k} every step; tokens/step (draft rows/step)"
    )
    print(f"{'prompts':<10} {'lookup':<7} " + " ".join(f"{rule:>16}" for rule in RULES))
    for kind, messages in sets.items():
        results = llm.generate([llm.chat_prompt(m) for m in messages], params)
        runs = [(list(r.prompt_token_ids), list(r.outputs[0].token_ids)) for r in results]
        for window in ((1, 5), (2, 4), (2, 5), (3, 5)):
            cells = [replay(runs, args.k, rule, window) for rule in RULES]
            row = " ".join(f"{t:>9.3f} ({r:.2f})" for t, r in cells)
            print(f"{kind:<10} {window[0]}-{window[1]:<5} {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
