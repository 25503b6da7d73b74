"""``spec-backend serve`` under load: requests/s and time to first token at 1, 8 and 32 concurrent
streaming clients, in one run, for one of two comparisons:

* ``--workload chat`` (default): without and with speculation (ngram K=4), short code-edit prompts,
  prefix caching off on both (so the comparison is speculation's alone);
* ``--workload agent``: an agent's requests (one long shared system prompt with tool descriptions and a
  shared file, then a short question of each request's own), speculation on (ngram K=4), without and
  with automatic prefix caching (``--no-enable-prefix-caching`` against the default).

    .venv/bin/python benchmarks/bench_server.py [--workload chat|agent] [--model smollm2]
        [--max-tokens 32] [--clients 1 8 32]

Each configuration starts its own server (``--max-num-seqs`` = the largest client count), warms it up,
then each client level sends ``max(8, 2 * clients)`` chat-formatted prompts, greedy, streaming through
the ``openai`` client. Reported per level: requests/s, the median time to first token (first non-empty
content chunk), the second configuration's ratios to the first, and (agent) the prompt tokens the
second server served from its cache (``usage.prompt_tokens_details.cached_tokens`` of one more request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
TASKS = [
    "Rename the variable x to total in: x = 0\nfor i in range(10):\n    x += i\nprint(x)",
    "Add type hints to: def area(w, h):\n    return w * h",
    "Rewrite with a list comprehension: out = []\nfor v in values:\n    out.append(v * 2)",
    "Add a docstring to: def mean(xs):\n    return sum(xs) / len(xs)",
]
TOOLS = [
    ("read_file", "path: str", "Return the text of the file at path, relative to the repository root."),
    ("write_file", "path: str, text: str", "Replace the file at path with text; create folders."),
    ("run_tests", "pattern: str", "Run the test suite, or the tests whose names match pattern."),
    ("search", "query: str", "Search the repository for query; return matching lines with paths."),
    ("list_dir", "path: str", "List the entries of a folder, with sizes and modification times."),
    ("git_diff", "", "Show the uncommitted changes of the working tree as a unified diff."),
]
FILE = "\n".join(
    f"def step_{i}(values, scale={i}):\n    out = []\n    for v in values:\n"
    f"        out.append(v * scale + {i})\n    return out\n"
    for i in range(12)
)
QUESTIONS = [
    "Which function adds the largest constant?",
    "Rewrite step_3 with a list comprehension.",
    "Add type hints to step_7.",
    "Which tool shows uncommitted changes?",
    "Write a test for step_0.",
    "Rename values to xs in step_5.",
    "What does step_11 return for [1, 2]?",
    "Which tool would you call first to fix a failing test?",
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(model: str, flags: list[str], max_num_seqs: int) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = _port()
    command = [sys.executable, "-m", "spec_backend.cli", "serve", model, "--port", str(port)]
    command += ["--served-model-name", "m", "--max-num-seqs", str(max_num_seqs)]
    command += ["--uvicorn-log-level", "warning", *flags]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"server for {model} did not start")


def chat_messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": TASKS[i % len(TASKS)]}]


def agent_messages(i: int) -> list[dict[str, str]]:
    """The agent's shared system prompt and file, then request ``i``'s own question."""
    tools = "\n".join(f"- {name}({args}): {doc}" for name, args, doc in TOOLS)
    system = (
        f"You are a coding agent. Call one tool per turn. Tools:\n{tools}\nThe open file, tools.py:\n{FILE}"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]


async def one(api: Any, messages: list[dict[str, str]], max_tokens: int) -> float:
    """Seconds to the first non-empty content chunk of one streamed answer (read to the end)."""
    start = time.perf_counter()
    first = None
    stream = await api.chat.completions.create(
        model="m", messages=messages, max_tokens=max_tokens, temperature=0, stream=True
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.perf_counter() - start
    return first if first is not None else float("nan")


async def level(base: str, clients: int, max_tokens: int, messages: Any) -> dict[str, float]:
    import openai

    api = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    total = max(8, 2 * clients)
    gate = asyncio.Semaphore(clients)

    async def gated(i: int) -> float:
        async with gate:
            return await one(api, messages(i), max_tokens)

    start = time.perf_counter()
    try:
        results = await asyncio.gather(*(gated(i) for i in range(total)))
    finally:
        await api.close()  # inside this event loop (asyncio.run closes it after)
    seconds = time.perf_counter() - start
    return {"req_s": total / seconds, "ttft_median_s": statistics.median(results), "seconds": seconds}


def cached_tokens(base: str, messages: list[dict[str, str]]) -> tuple[int, int]:
    """Prompt tokens and cached prompt tokens of one more (non-streamed) request."""
    import httpx

    body = {"model": "m", "messages": messages, "max_tokens": 1, "temperature": 0}
    usage = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600).json()["usage"]
    return int(usage["prompt_tokens"]), int(usage["prompt_tokens_details"]["cached_tokens"])


def measure(
    model: str, flags: list[str], levels: list[int], max_tokens: int, messages: Any
) -> tuple[dict[int, Any], tuple[int, int]]:
    proc, base = start(model, flags, max(levels))
    try:
        asyncio.run(level(base, 1, 4, messages))  # warm-up (first-call compilation, caches)
        results = {c: asyncio.run(level(base, c, max_tokens, messages)) for c in levels}
        return results, cached_tokens(base, messages(len(QUESTIONS) + 1))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=["chat", "agent"], default="chat")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args(argv)
    spec = ["--speculative-config", json.dumps(SPEC)]
    if args.workload == "chat":
        names, messages = ("plain", "spec"), chat_messages
        configs = (["--no-enable-prefix-caching"], ["--no-enable-prefix-caching", *spec])
    else:
        names, messages = ("no-cache", "cache"), agent_messages
        configs = (["--no-enable-prefix-caching", *spec], spec)
    first, _ = measure(args.model, configs[0], args.clients, args.max_tokens, messages)
    second, (prompt, cached) = measure(args.model, configs[1], args.clients, args.max_tokens, messages)
    print(
        f"\nspec-backend serve {args.model}, {os.cpu_count()} CPUs, greedy chat ({args.workload}), "
        f"{args.max_tokens} max tokens"
    )
    if args.workload == "agent":
        print(f"one more agent request: {prompt} prompt tokens, {cached} served from the prefix cache")
    a, b = names
    print(
        f"{'clients':>8}{a + ' req/s':>16}{b + ' req/s':>13}{'ratio':>8}"
        f"{a + ' TTFT':>15}{b + ' TTFT':>12}{'ratio':>8}"
    )
    for c in args.clients:
        p, q = first[c], second[c]
        print(
            f"{c:>8}{p['req_s']:>16.2f}{q['req_s']:>13.2f}{q['req_s'] / p['req_s']:>7.2f}x"
            f"{p['ttft_median_s']:>14.2f}s{q['ttft_median_s']:>11.2f}s"
            f"{p['ttft_median_s'] / q['ttft_median_s']:>7.2f}x"
        )


if __name__ == "__main__":
    main()
