"""Benchmark of the model-free proposers: time per step and greedy acceptance on code-edit sequences.

Usage: ``python benchmarks/bench_proposers.py [--device cpu|cuda] [--steps 60] [--threads 1] [--quick]``

Corpus: a synthetic "source file" (token ids of code-like lines built from a small set of identifiers,
keywords and templates), and an "edited" copy with small local changes (renamed identifiers, replaced,
inserted and deleted lines). A request's prompt holds the original; its model output is the edited
file, so the drafters can copy long spans.

Timing (median after warm-up): one step = for every request, ``update`` with the next 3 true tokens,
then one ``propose`` for the whole batch (K = 8, prompt_lookup 2..5; suffix: depth 24, defaults).
Acceptance: greedy verification simulated per request: a draft token is accepted iff it equals the true
next token; each step then appends the accepted tokens plus the true next (recovered/bonus) token.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from spec_backend.proposers import NgramGpuProposer, NgramProposer, Proposer, SuffixProposer

K = 8
TOKENS_PER_STEP = 3
VOCAB = 32000


def make_file(rng: np.random.Generator, num_tokens: int) -> list[int]:
    """Code-like token stream: lines from templates over a small identifier pool."""
    idents = rng.integers(1000, VOCAB, 300).tolist()
    # ids 10..39 play keywords and punctuation ("def", "return", "(", ")", ":", "=", "self", ...)
    out: list[int] = []
    while len(out) < num_tokens:
        kind = int(rng.integers(0, 4))
        a, b, c = (int(x) for x in rng.choice(idents, 3))
        if kind == 0:
            line = [10, a, 12, 13, b, 14, c, 15, 16]  # def a(self, b, c):
        elif kind == 1:
            line = [2, 2, 17, a, 18, 13, 19, b, 12, c, 15]  # self.a = b(c)
        elif kind == 2:
            line = [2, 2, 11, a, 20, b, 21, int(rng.integers(100, 1000))]  # return a + b * 7
        else:
            line = [2, 2, 22, a, 23, b, 16, 2, 2, 2, c, 12, a, 15]  # for a in b: c(a)
        out.extend([*line, 1])  # 1 = newline
    return out[:num_tokens]


def edit_file(rng: np.random.Generator, tokens: list[int], rate: float = 0.05) -> list[int]:
    """Small local edits: per line, with probability ``rate`` each: rename, replace, insert, delete."""
    lines: list[list[int]] = []
    cur: list[int] = []
    for t in tokens:
        cur.append(t)
        if t == 1:
            lines.append(cur)
            cur = []
    if cur:
        lines.append(cur)
    out: list[int] = []
    for line in lines:
        u = rng.random()
        if u < rate:  # rename one token
            line = list(line)
            line[int(rng.integers(0, len(line)))] = int(rng.integers(1000, VOCAB))
        elif u < 2 * rate:  # replace the line
            line = [2, 2, *rng.integers(1000, VOCAB, 6).tolist(), 1]
        elif u < 3 * rate:  # insert a new line after
            out.extend(line)
            line = [2, 2, 11, *rng.integers(1000, VOCAB, 3).tolist(), 1]
        elif u < 4 * rate:
            continue  # delete
        out.extend(line)
    return out


def make_request(rng: np.random.Generator, context: int) -> tuple[list[int], list[int]]:
    """(prompt, output): prompt = instruction + original file, output = edited file; ~context tokens."""
    original = make_file(rng, context // 2 + context // 8)  # edits shorten or lengthen the copy
    return [3, 4, 5, *original, 6], edit_file(rng, original)


def build(name: str, device: str) -> Proposer:
    if name == "ngram":
        return NgramProposer(K, 2, 5)
    if name == "ngram_gpu":
        return NgramGpuProposer(K, 2, 5, device=device)
    return SuffixProposer(K, max_tree_depth=24, max_cached_requests=10000)


def sync(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def time_steps(name: str, batch: int, context: int, steps: int, device: str) -> tuple[float, float]:
    """Median (wall, process CPU) microseconds per step: TOKENS_PER_STEP-token updates + one propose."""
    rng = np.random.default_rng(batch * 100003 + context)
    proposer = build(name, device)
    seqs = []
    for i in range(batch):
        prompt, output = make_request(rng, context)
        full = (prompt + output)[:context]
        assert len(full) == context, "corpus too short"
        start = context - TOKENS_PER_STEP * (steps + 10)  # the context is ~`context` tokens while timed
        proposer.add_request(f"r{i}", full[:start])
        seqs.append((full, start))
    ids = [f"r{i}" for i in range(batch)]
    wait = sync(device)
    times, cpu = [], []
    for step in range(steps + 10):
        wait()
        t0, c0 = time.perf_counter(), time.process_time()
        for i, (full, start) in enumerate(seqs):
            lo = start + step * TOKENS_PER_STEP
            proposer.update(ids[i], full[lo : lo + TOKENS_PER_STEP])
        proposer.propose(ids)
        wait()
        if step >= 10:
            times.append((time.perf_counter() - t0) * 1e6)
            cpu.append((time.process_time() - c0) * 1e6)
    return statistics.median(times), statistics.median(cpu)


def acceptance(name: str, num_files: int, context: int) -> tuple[float, float]:
    """(mean accepted draft tokens per step, mean drafted tokens per step) over sequential requests.

    Two requests per file, one after the other: two different edits of the same original, so the
    second request's output overlaps the first one's (what suffix decoding's global cache is for).
    """
    rng = np.random.default_rng(7)
    proposer = build(name, "cpu")
    accepted = drafted = steps = 0
    jobs = []
    for _ in range(num_files):
        original = make_file(rng, context // 2)
        jobs += [([3, 4, 5, *original, 6], edit_file(rng, original)) for _ in range(2)]
    for r, (prompt, output) in enumerate(jobs):
        rid = f"a{r}"
        proposer.add_request(rid, prompt)
        pos = 0
        while pos < len(output):
            draft = proposer.propose([rid], [len(output) - pos - 1])[0]
            n = 0
            while n < len(draft) and draft[n] == output[pos + n]:
                n += 1
            new = output[pos : pos + n + 1]  # accepted drafts + the recovered/bonus token
            proposer.update(rid, new)
            pos += len(new)
            accepted += n
            drafted += len(draft)
            steps += 1
        proposer.remove_request(rid)
    return accepted / steps, drafted / steps


def verdict(value: float, limit: float) -> str:
    return "PASS" if value < limit else "FAIL"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="torch device for ngram_gpu")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per configuration")
    parser.add_argument("--quick", action="store_true", help="B=1 and 2k only")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: no barrier stalls)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    configs = [(1, 2048)] if args.quick else [(1, 2048), (1, 8192), (64, 2048), (64, 8192)]
    print(
        f"torch {torch.__version__}, ngram_gpu device {args.device} ({args.threads} CPU threads), K={K}, "
        f"{TOKENS_PER_STEP} tokens/step"
    )
    print(
        "| proposer | B | context | µs/step (wall) | µs/step (CPU) | µs/request (wall) | µs/request (CPU) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    results: dict[tuple[str, int, int], tuple[float, float]] = {}
    for name in ("ngram", "ngram_gpu", "suffix"):
        for batch, context in configs:
            wall, cpu = time_steps(name, batch, context, args.steps, args.device)
            results[(name, batch, context)] = (wall, cpu)
            cells = [
                name,
                batch,
                context,
                f"{wall:.0f}",
                f"{cpu:.0f}",
                f"{wall / batch:.1f}",
                f"{cpu / batch:.1f}",
            ]
            print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
    print("\n| proposer | accepted tokens/step | drafted tokens/step | tokens/step (incl. bonus) |")
    print("|---|---:|---:|---:|")
    for name in ("ngram", "ngram_gpu", "suffix"):
        acc, dr = acceptance(name, 3 if not args.quick else 1, 2048)
        print(f"| {name} | {acc:.2f} | {dr:.2f} | {acc + 1:.2f} |", flush=True)
    print()
    if not args.quick:
        wall, cpu = results[("ngram", 64, 8192)]
        print(f"{verdict(wall, 1000)}: ngram B=64 8k: {wall:.0f} µs/step wall, {cpu:.0f} CPU (target < 1000)")
    for batch, context in configs:
        wall, cpu = (x / batch for x in results[("suffix", batch, context)])
        print(
            f"{verdict(wall, 100)}: suffix B={batch} {context}: {wall:.1f} µs/request/step wall, "
            f"{cpu:.1f} CPU (target < 100)"
        )


if __name__ == "__main__":
    main()
