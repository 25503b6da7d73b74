"""``spec-backend serve`` under load: requests/s and time to first token at 1, 8 and 32 concurrent
streaming clients, without and with speculation (ngram K=4), in one run.

    .venv/bin/python benchmarks/bench_server.py [--model smollm2] [--max-tokens 32] [--clients 1 8 32]

Each configuration starts its own server (``--max-num-seqs`` = the largest client count), warms it up,
then each client level sends ``max(8, 2 * clients)`` chat-formatted code-edit prompts, greedy, streaming
through the ``openai`` client. Reported per level: requests/s, the median time to first token (first
non-empty content chunk) and the speculative/plain ratio of requests/s.
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


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(model: str, spec: dict[str, Any] | None, max_num_seqs: int) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = _port()
    command = [sys.executable, "-m", "spec_backend.cli", "serve", model, "--port", str(port)]
    command += [
        "--served-model-name",
        "m",
        "--max-num-seqs",
        str(max_num_seqs),
        "--uvicorn-log-level",
        "warning",
    ]
    if spec is not None:
        command += ["--speculative-config", json.dumps(spec)]
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


async def one(api: Any, task: str, max_tokens: int) -> float:
    """Seconds to the first non-empty content chunk of one streamed answer (read to the end)."""
    start = time.perf_counter()
    first = None
    stream = await api.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": task}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.perf_counter() - start
    return first if first is not None else float("nan")


async def level(base: str, clients: int, max_tokens: int) -> dict[str, float]:
    import openai

    api = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    total = max(8, 2 * clients)
    gate = asyncio.Semaphore(clients)

    async def gated(i: int) -> float:
        async with gate:
            return await one(api, TASKS[i % len(TASKS)], max_tokens)

    start = time.perf_counter()
    results = await asyncio.gather(*(gated(i) for i in range(total)))
    seconds = time.perf_counter() - start
    ttft = sorted(results)
    return {
        "req_s": total / seconds,
        "ttft_median_s": statistics.median(ttft),
        "seconds": seconds,
    }


def measure(model: str, spec: dict[str, Any] | None, levels: list[int], max_tokens: int) -> dict[int, Any]:
    proc, base = start(model, spec, max(levels))
    try:
        asyncio.run(level(base, 1, 4))  # warm-up (first-call compilation, caches)
        return {c: asyncio.run(level(base, c, max_tokens)) for c in levels}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args(argv)
    plain = measure(args.model, None, args.clients, args.max_tokens)
    spec = measure(args.model, SPEC, args.clients, args.max_tokens)
    print(
        f"\nspec-backend serve {args.model}, {os.cpu_count()} CPUs, greedy chat, {args.max_tokens} max tokens"
    )
    print(
        f"{'clients':>8}{'plain req/s':>13}{'spec req/s':>12}{'ratio':>8}{'plain TTFT':>12}{'spec TTFT':>11}"
    )
    for c in args.clients:
        p, s = plain[c], spec[c]
        print(
            f"{c:>8}{p['req_s']:>13.2f}{s['req_s']:>12.2f}{s['req_s'] / p['req_s']:>7.2f}x"
            f"{p['ttft_median_s']:>11.2f}s{s['ttft_median_s']:>10.2f}s"
        )


if __name__ == "__main__":
    main()
