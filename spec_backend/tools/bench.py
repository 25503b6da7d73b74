"""End-to-end benchmark: the engine with and without speculation against transformers' ``generate``.

One model is loaded once and shared: transformers runs it with its own SDPA attention (plain, and with
``prompt_lookup_num_tokens=K``, its n-gram speculation), the engine with the backend's ragged attention.
All runs are greedy on the same token ids, so every system should emit the same tokens; the report
counts mismatching outputs. Tokens/s = generated tokens / wall time of the whole run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_backend.engine.llm import LLM
from spec_backend.engine.params import SamplingParams
from spec_backend.runtime.loader import load_model
from spec_backend.tools.prompts import code_edit_prompts

Runner = Callable[[list[list[int]]], tuple[list[list[int]], float | None]]


@dataclass
class System:
    """One measured configuration: a name, its batch size and how to run a list of prompts."""

    name: str
    batch_size: int
    run: Runner


@dataclass
class RunResult:
    """One system over the whole workload, one entry per sample (a sample runs every prompt once)."""

    name: str
    batch_size: int
    outputs: list[list[list[int]]] = field(default_factory=list)  # [sample][prompt] tokens
    seconds: list[float] = field(default_factory=list)  # [sample]
    acceptance: list[float] = field(default_factory=list)  # per speculative run

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs[0]) if self.outputs else 0

    @property
    def tokens_per_s(self) -> list[float]:
        """[sample] generated tokens / wall time."""
        return [
            sum(len(o) for o in out) / t if t > 0 else 0.0
            for out, t in zip(self.outputs, self.seconds, strict=True)
        ]

    @property
    def acceptance_length(self) -> float | None:
        return sum(self.acceptance) / len(self.acceptance) if self.acceptance else None


def _hf_generate(
    model: Any, eos_ids: frozenset[int], prompts: list[list[int]], max_tokens: int, lookup: int | None
) -> list[list[int]]:
    """transformers' greedy ``generate`` one prompt at a time (its prompt lookup needs batch 1)."""
    eos = sorted(eos_ids)
    outs = []
    for ids in prompts:
        x = torch.tensor([ids], device=model.device)
        extra: dict[str, Any] = {"prompt_lookup_num_tokens": lookup} if lookup else {}
        y = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=eos or None,
            pad_token_id=eos[0] if eos else 0,
            **extra,
        )
        outs.append(y[0, len(ids) :].tolist())
    return outs


def _engine_run(
    llm: LLM, prompts: list[list[int]], max_tokens: int, batch: int
) -> tuple[list[list[int]], float]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.engine.max_num_seqs = batch
    before = llm.metrics.total.num_drafts, llm.metrics.total.num_accepted_tokens
    outs: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        results = llm.generate(prompts[i : i + batch], params)
        outs.extend(r.outputs[0].token_ids for r in results)
    drafts = llm.metrics.total.num_drafts - before[0]
    accepted = llm.metrics.total.num_accepted_tokens - before[1]
    return outs, (1.0 + accepted / drafts if drafts else 1.0)


def _systems(
    llm: LLM, baseline: Any, max_tokens: int, k: int, batch_size: int
) -> tuple[list[System], list[System]]:
    """The batch-1 systems (run prompt by prompt, interleaved) and the batched ones."""

    def hf(lookup: int | None) -> Runner:
        return lambda ids: (_hf_generate(baseline, llm.eos_token_ids, ids, max_tokens, lookup), None)

    def engine(speculate: bool, batch: int) -> Runner:
        def run(ids: list[list[int]]) -> tuple[list[list[int]], float | None]:
            llm.set_speculation(speculate)
            out, acc = _engine_run(llm, ids, max_tokens, batch)
            return out, acc if speculate else None

        return run

    spec_name = f"engine, ngram K={k}"
    single = [
        System("transformers generate", 1, hf(None)),
        System("transformers prompt-lookup", 1, hf(k)),
        System("engine, no speculation", 1, engine(False, 1)),
        System(spec_name, 1, engine(True, 1)),
    ]
    batched = [
        System(n, batch_size, engine(s, batch_size))
        for n, s in (("engine, no speculation", False), (spec_name, True))
    ]
    return single, batched


def _sample(
    single: list[System], batched: list[System], ids: list[list[int]], results: list[RunResult], bar: Any
) -> None:
    """One sample of every system. Batch-1 systems take turns prompt by prompt, so load changes on a
    shared machine hit all alike; then each batched system runs the whole list."""
    for result in results:
        result.outputs.append([])
        result.seconds.append(0.0)
    for prompt in ids:
        for result, system in zip(results, single, strict=False):
            start = time.perf_counter()
            out, acc = system.run([prompt])
            result.seconds[-1] += time.perf_counter() - start
            result.outputs[-1] += out
            result.acceptance += [acc] if acc is not None else []
            bar.update(1)
    for result, system in zip(results[len(single) :], batched, strict=True):
        start = time.perf_counter()
        out, acc = system.run(ids)
        result.seconds[-1] = time.perf_counter() - start
        result.outputs[-1] = out
        result.acceptance += [acc] if acc is not None else []
        bar.update(len(ids))


def run_e2e_bench(
    model: str = "smollm2",
    num_speculative_tokens: int = 4,
    prompt_lookup_min: int = 1,
    prompt_lookup_max: int = 4,
    max_tokens: int = 128,
    num_prompts: int = 8,
    batch_size: int = 8,
    samples: int = 3,
    log: Callable[[str], None] = print,
    progress: bool = True,
) -> dict[str, Any]:
    """Run every system ``samples`` times on the same greedy workload; return rows (medians and ranges)
    and ratios of the medians."""
    from tqdm import tqdm

    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    spec = {
        "method": "ngram",
        "num_speculative_tokens": num_speculative_tokens,
        "prompt_lookup_min": prompt_lookup_min,
        "prompt_lookup_max": prompt_lookup_max,
    }
    # prefix caching off: transformers' generate recomputes every prompt of the repeated samples
    quiet: dict[str, Any] = {"log_stats_interval": None, "enable_prefix_caching": False}
    llm = LLM(model, speculative_config=spec, max_num_seqs=batch_size, **quiet)
    if llm.tokenizer is None:
        raise ValueError(f"the e2e benchmark needs a model with a tokenizer; {model!r} has none")
    ids = [
        list(llm.tokenizer(llm.chat_prompt(m), add_special_tokens=True)["input_ids"])
        for m in code_edit_prompts(num_prompts)
    ]
    # transformers' own baseline runs a separately loaded, unmodified model with its stock SDPA
    # attention: exactly what a user of ``generate`` gets (the engine's copy carries backend choices).
    baseline = load_model(llm.source, "sdpa", llm.model.dtype, llm.model.device)
    single, batched = _systems(llm, baseline, max_tokens, num_speculative_tokens, batch_size)
    log("warming up ...")
    _hf_generate(baseline, llm.eos_token_ids, ids[:1], 8, None)
    llm.set_speculation(True)
    _engine_run(llm, ids[:2], 8, min(2, batch_size))  # the engine holds batch_size slots
    results = [RunResult(s.name, s.batch_size) for s in (*single, *batched)]
    total = samples * len(ids) * len(results)
    with tqdm(total=total, desc="bench e2e", unit="run", disable=not progress) as bar:
        for i in range(samples):
            bar.set_postfix_str(f"sample {i + 1}/{samples}")
            _sample(single, batched, ids, results, bar)
    llm.set_speculation(True)
    setup = {
        **llm.describe(),
        "max_tokens": max_tokens,
        "num_prompts": len(ids),
        "samples": samples,
        "torch_threads": torch.get_num_threads(),
    }
    ratios = _ratios(results, num_speculative_tokens, batch_size)
    return {"setup": setup, "rows": _rows(results), "ratios": ratios}


def _rows(results: list[RunResult]) -> list[dict[str, Any]]:
    reference = results[0].outputs[0]  # transformers generate, first sample
    return [
        {
            "system": r.name,
            "batch": r.batch_size,
            "tokens": r.tokens,
            "tokens_per_s": round(statistics.median(r.tokens_per_s), 2),
            "tokens_per_s_min": round(min(r.tokens_per_s), 2),
            "tokens_per_s_max": round(max(r.tokens_per_s), 2),
            "acceptance_length": None if r.acceptance_length is None else round(r.acceptance_length, 3),
            "outputs_differing_from_transformers": sum(
                a != b for out in r.outputs for a, b in zip(out, reference, strict=True)
            ),
        }
        for r in results
    ]


def _ratios(results: list[RunResult], k: int, batch_size: int) -> dict[str, dict[str, float]]:
    """Each ratio is the ratio of the two medians in the table (so the ratios agree with the table and
    with each other), with the range of the same ratio over the samples as its noise."""
    by = {(r.name, r.batch_size): r.tokens_per_s for r in results}
    spec, plain = f"engine, ngram K={k}", "engine, no speculation"
    pairs = {
        "engine ngram b1 / transformers prompt-lookup b1": ((spec, 1), ("transformers prompt-lookup", 1)),
        "engine plain b1 / transformers plain b1": ((plain, 1), ("transformers generate", 1)),
        f"engine ngram b{batch_size} / transformers plain b1": (
            (spec, batch_size),
            ("transformers generate", 1),
        ),
        f"engine plain b{batch_size} / transformers plain b1": (
            (plain, batch_size),
            ("transformers generate", 1),
        ),
    }
    out = {}
    for name, (a, b) in pairs.items():
        per_sample = [x / y for x, y in zip(by[a], by[b], strict=True)]
        out[name] = {
            "ratio": round(statistics.median(by[a]) / statistics.median(by[b]), 3),
            "min": round(min(per_sample), 3),
            "max": round(max(per_sample), 3),
        }
    return out


def format_report(report: dict[str, Any]) -> str:
    """The report as an aligned text table plus the ratios."""
    header = ("system", "batch", "tokens", "tokens/s (median)", "min", "max", "accept len", "diff vs HF")
    keys = (
        "system",
        "batch",
        "tokens",
        "tokens_per_s",
        "tokens_per_s_min",
        "tokens_per_s_max",
        "acceptance_length",
    )
    table = [header] + [
        (
            *(("-" if row[k] is None else str(row[k])) for k in keys),
            str(row["outputs_differing_from_transformers"]),
        )
        for row in report["rows"]
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    samples = report["setup"]["samples"]
    lines += ["", f"ratios of the medians over {samples} sample(s) (per-sample range in brackets):"]
    lines += [
        f"{name}: {v['ratio']:.2f}x [{v['min']:.2f}-{v['max']:.2f}]" for name, v in report["ratios"].items()
    ]
    return "\n".join(lines)
