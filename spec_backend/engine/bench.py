"""End-to-end benchmark: the engine with and without speculation against transformers' ``generate``.

One model is loaded once and shared: transformers runs it with its own SDPA attention (plain, and with
``prompt_lookup_num_tokens=K``, its n-gram speculation), the engine with the backend's ragged attention.
All runs are greedy on the same token ids, so every system should emit the same tokens; the report
counts mismatching outputs. Tokens/s = generated tokens / wall time of the whole run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from spec_backend.engine.llm import LLM
from spec_backend.engine.loader import load_model
from spec_backend.engine.params import SamplingParams
from spec_backend.engine.prompts import code_edit_prompts


@dataclass
class RunResult:
    """One system's run: what it generated and how long it took."""

    name: str
    batch_size: int
    outputs: list[list[int]]
    seconds: float
    acceptance_length: float | None = None

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


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


def run_e2e_bench(
    model: str = "smollm2",
    num_speculative_tokens: int = 4,
    prompt_lookup_min: int = 1,
    prompt_lookup_max: int = 4,
    max_tokens: int = 128,
    num_prompts: int = 8,
    batch_size: int = 8,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every system on the same greedy workload; return the rows and the target ratios."""
    spec = {
        "method": "ngram",
        "num_speculative_tokens": num_speculative_tokens,
        "prompt_lookup_min": prompt_lookup_min,
        "prompt_lookup_max": prompt_lookup_max,
    }
    llm = LLM(model, speculative_config=spec, max_num_seqs=batch_size, log_stats_interval=None)
    prompts = [llm.chat_prompt(m) for m in code_edit_prompts(num_prompts)]
    tok = llm.tokenizer
    if tok is None:
        raise ValueError(f"the e2e benchmark needs a model with a tokenizer; {model!r} has none")
    ids = [list(tok(p, add_special_tokens=True)["input_ids"]) for p in prompts]
    # transformers' own baseline runs a separately loaded, unmodified model with its stock SDPA
    # attention: exactly what a user of ``generate`` gets (the engine's copy carries backend choices).
    baseline = load_model(llm.source, "sdpa", llm.model.dtype, llm.model.device)

    def hf(lookup: int | None) -> Callable[[list[list[int]]], tuple[list[list[int]], float | None]]:
        def run(batch_ids: list[list[int]]) -> tuple[list[list[int]], float | None]:
            return _hf_generate(baseline, llm.eos_token_ids, batch_ids, max_tokens, lookup), None

        return run

    def engine(
        speculate: bool, batch: int
    ) -> Callable[[list[list[int]]], tuple[list[list[int]], float | None]]:
        def run(batch_ids: list[list[int]]) -> tuple[list[list[int]], float | None]:
            llm.set_speculation(speculate)
            out, acc = _engine_run(llm, batch_ids, max_tokens, batch)
            return out, acc if speculate else None

        return run

    log("warming up ...")
    _hf_generate(baseline, llm.eos_token_ids, ids[:1], 8, None)
    llm.set_speculation(True)
    _engine_run(llm, ids[:2], 8, 2)

    spec_name = f"engine, ngram K={num_speculative_tokens}"
    b1: list[tuple[str, Callable[[list[list[int]]], tuple[list[list[int]], float | None]]]] = [
        ("transformers generate", hf(None)),
        ("transformers prompt-lookup", hf(num_speculative_tokens)),
        ("engine, no speculation", engine(False, 1)),
        (spec_name, engine(True, 1)),
    ]
    # batch 1: the systems take turns prompt by prompt, so load changes on a shared machine hit all alike
    results = [RunResult(name, 1, [], 0.0) for name, _ in b1]
    accepted: list[float] = []
    log(f"batch 1: {len(b1)} systems x {len(ids)} prompts, interleaved ...")
    for prompt in ids:
        for result, (_, fn) in zip(results, b1, strict=True):
            start = time.perf_counter()
            out, acc = fn([prompt])
            result.seconds += time.perf_counter() - start
            result.outputs += out
            if result.name == spec_name and acc is not None:
                accepted.append(acc)
    results[-1].acceptance_length = sum(accepted) / len(accepted) if accepted else None
    for name, speculate in (("engine, no speculation", False), (spec_name, True)):
        log(f"running {name} (batch {batch_size}) ...")
        start = time.perf_counter()
        out, acc = engine(speculate, batch_size)(ids)
        results.append(RunResult(name, batch_size, out, time.perf_counter() - start, acc))
    llm.set_speculation(True)
    reference = results[0].outputs
    rows = [
        {
            "system": r.name,
            "batch": r.batch_size,
            "tokens": r.tokens,
            "seconds": round(r.seconds, 3),
            "tokens_per_s": round(r.tokens_per_s, 2),
            "acceptance_length": None if r.acceptance_length is None else round(r.acceptance_length, 3),
            "outputs_differing_from_transformers": sum(
                a != b for a, b in zip(r.outputs, reference, strict=True)
            ),
        }
        for r in results
    ]
    tps = {(r.name, r.batch_size): r.tokens_per_s for r in results}
    hf_plain = tps[("transformers generate", 1)]
    ratios = {
        "engine ngram b1 / transformers prompt-lookup b1": tps[(spec_name, 1)]
        / tps[("transformers prompt-lookup", 1)],
        "engine plain b1 / transformers plain b1": tps[("engine, no speculation", 1)] / hf_plain,
        f"engine ngram b{batch_size} / transformers plain b1": tps[(spec_name, batch_size)] / hf_plain,
        f"engine plain b{batch_size} / transformers plain b1": tps[("engine, no speculation", batch_size)]
        / hf_plain,
    }
    return {
        "setup": {
            **llm.describe(),
            "max_tokens": max_tokens,
            "num_prompts": len(ids),
            "torch_threads": torch.get_num_threads(),
        },
        "rows": rows,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as an aligned text table plus the ratios."""
    header = ("system", "batch", "tokens", "seconds", "tokens/s", "accept len", "diff vs HF")
    keys = ("system", "batch", "tokens", "seconds", "tokens_per_s", "acceptance_length")
    table = [header] + [
        (
            *(("-" if row[k] is None else str(row[k])) for k in keys),
            str(row["outputs_differing_from_transformers"]),
        )
        for row in report["rows"]
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    lines.append("")
    lines += [f"{name}: {value:.2f}x" for name, value in report["ratios"].items()]
    return "\n".join(lines)
