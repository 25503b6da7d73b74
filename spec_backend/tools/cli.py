"""Engine subcommands of ``spec-backend``: ``generate``, ``bench e2e`` and ``demo``.

``spec_backend/cli.py`` imports this module lazily and calls ``add_generate_parser``,
``add_bench_parser`` and ``add_demo_parser`` with its subparsers; each command returns an exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from spec_backend.tools.errors import CliError, fail


def _json_arg(text: str | None, name: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CliError(f"{name} is not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise CliError(f"{name} must be a JSON object, got {text!r}")
    return value


def build_llm(args: argparse.Namespace, **extra: Any) -> Any:
    """The ``LLM`` of the engine flags; a bad flag, backend or model raises ``CliError``."""
    from spec_backend.backends.base import BackendError
    from spec_backend.engine import LLM

    try:
        return LLM(
            args.model,
            speculative_config=_json_arg(args.speculative_config, "--speculative-config"),
            additional_config=_json_arg(args.additional_config, "--additional-config"),
            backend=args.backend,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
            seed=args.seed,
            quantization=getattr(args, "quantization", None),
            enable_prefix_caching=args.enable_prefix_caching,
            block_size=args.block_size,
            prefix_cache_memory_bytes=args.prefix_cache_memory_bytes,
            **extra,
        )
    except (ValueError, BackendError, OSError) as exc:
        raise CliError(exc) from exc


def summary_table(outputs: list[Any], seconds: float) -> str:
    """Throughput and acceptance of one ``generate`` call as aligned text."""
    from spec_backend.metrics import SpecDecodingStats

    total = SpecDecodingStats()
    for o in outputs:
        s = o.spec_stats
        total.merge(
            SpecDecodingStats(
                s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.accepted_per_position
            )
        )
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    errors = sum(o.outputs[0].finish_reason == "error" for o in outputs)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    cached = sum(o.num_cached_tokens for o in outputs)
    rows = [
        ("requests", f"{len(outputs)} ({errors} failed)"),
        ("prompt tokens (from the prefix cache)", f"{prompt_tokens} ({cached})"),
        ("generated tokens", str(tokens)),
        ("wall time", f"{seconds:.2f} s"),
        ("tokens/s", f"{tokens / seconds:.2f}" if seconds > 0 else "-"),
        ("mean acceptance length", f"{total.mean_acceptance_length:.2f}"),
        ("acceptance rate", f"{100 * total.acceptance_rate:.1f}%"),
        (
            "drafts / draft tokens / accepted",
            f"{total.num_drafts} / {total.num_draft_tokens} / {total.num_accepted_tokens}",
        ),
    ]
    rows += [
        (f"  accepted at position {i}", f"{100 * r:.1f}%")
        for i, r in enumerate(total.per_position_acceptance_rate)
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def add_engine_args(p: argparse.ArgumentParser, positional_model: bool = False) -> None:
    """The engine flags shared by ``generate``, ``bench`` and ``serve`` (``serve`` takes MODEL first)."""
    help_model = "model folder, .gguf file, or 'smollm2' (bundled)"
    if positional_model:
        p.add_argument("model", help=help_model)
    else:
        p.add_argument("--model", default="smollm2", help=help_model)
    p.add_argument(
        "--speculative-config",
        default=None,
        help='JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\'',
    )
    p.add_argument(
        "--additional-config",
        default=None,
        help="JSON, e.g. '{\"rejection_sampler_config\": {...}}'",
    )
    p.add_argument("--backend", default=None, help="backend name (default: auto)")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument(
        "--quantization",
        default=None,
        choices=["int4", "int8"],
        help="weight-only quantization on the cpu backend (opt-in, lossy)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="engine seed; each prompt's sampling seed derives from it (default 0, as in vLLM)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reuse the KV of shared prompt prefixes across requests (default: on, as in vLLM)",
    )
    p.add_argument("--block-size", type=int, default=None, help="prefix cache block, in positions (16)")
    p.add_argument(
        "--prefix-cache-memory-bytes",
        type=int,
        default=None,
        help="prefix cache budget (default: 4 full-length requests' KV, allocated as prompts arrive)",
    )


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate for ``--prompt``s / ``--prompts-file`` lines and print texts and a summary table."""
    try:
        return _generate(args)
    except CliError as exc:
        return fail(exc)


def _read_prompts(args: argparse.Namespace) -> list[str]:
    prompts: list[str] = list(args.prompt or [])
    if args.prompts_file:
        try:
            with open(args.prompts_file, encoding="utf-8") as fh:
                prompts += [line.rstrip("\n") for line in fh if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read --prompts-file {args.prompts_file!r}: {exc}") from exc
    if not prompts:
        raise CliError("give --prompt or --prompts-file")
    return prompts


def _generate(args: argparse.Namespace) -> int:
    from spec_backend.engine import SamplingParams

    prompts = _read_prompts(args)
    try:
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            stop=args.stop,
            max_tokens=args.max_tokens,
        )
    except ValueError as exc:
        raise CliError(exc) from exc
    llm = build_llm(args)
    texts = [llm.chat_prompt(p) for p in prompts] if args.chat else prompts
    try:
        # warm-up (one-time compilation and allocation stay out of tokens/s); its own seed, so the
        # engine's seed sequence, and therefore the run's output, is what it would be without it
        llm.generate(texts[:1], SamplingParams(temperature=0, max_tokens=1, seed=0))
        start = time.perf_counter()
        outputs = llm.generate(texts, params, use_tqdm=not args.no_progress and not args.json)
    except ValueError as exc:  # inputs are checked before any work
        raise CliError(exc) from exc
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps(_json_report(prompts, outputs, seconds)))
        return 0
    for prompt, out in zip(prompts, outputs, strict=True):
        c = out.outputs[0]
        print(f"=== prompt: {prompt!r}")
        print(c.text if c.finish_reason != "error" else f"[error] {c.error}")
        print(f"--- finish_reason={c.finish_reason} tokens={len(c.token_ids)}")
    print(summary_table(outputs, seconds))
    return 0


def _json_report(prompts: list[str], outputs: list[Any], seconds: float) -> dict[str, Any]:
    """``--json``: every completion and the run's totals (tokens/s after the warm-up)."""
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    rows = []
    for prompt, out in zip(prompts, outputs, strict=True):
        c, stats = out.outputs[0], out.spec_stats
        rows.append(
            {
                "prompt": prompt,
                "text": c.text,
                "token_ids": list(c.token_ids),
                "finish_reason": c.finish_reason,
                "error": c.error,
                "num_cached_tokens": out.num_cached_tokens,
                "num_draft_tokens": stats.num_draft_tokens,
                "num_accepted_tokens": stats.num_accepted_tokens,
            }
        )
    summary: dict[str, Any] = {"requests": len(outputs), "generated_tokens": tokens, "seconds": seconds}
    summary["tokens_per_s"] = tokens / seconds if seconds > 0 else None
    return {"outputs": rows, "summary": summary}


def add_generate_parser(sub: Any) -> None:
    """``spec-backend generate``."""
    p = sub.add_parser("generate", help="generate text with the embedded engine (speculative decoding)")
    add_engine_args(p)
    p.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    p.add_argument("--prompts-file", help="a file with one prompt per line")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print the completions and totals as one JSON object")
    p.add_argument(
        "--chat", action=argparse.BooleanOptionalAction, default=True, help="apply the chat template"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=cmd_generate)


def cmd_bench_e2e(args: argparse.Namespace) -> int:
    """Run the end-to-end benchmark and print (and optionally save) the report."""
    from spec_backend.tools.bench import format_report, run_e2e_bench

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    report = run_e2e_bench(
        model=args.model,
        num_speculative_tokens=args.num_speculative_tokens,
        prompt_lookup_min=args.prompt_lookup_min,
        prompt_lookup_max=args.prompt_lookup_max,
        max_tokens=args.max_tokens,
        num_prompts=args.num_prompts,
        batch_size=args.batch_size,
        samples=args.samples,
        log=lambda m: print(m, file=sys.stderr),
        progress=not args.no_progress,
    )
    print(format_report(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return 0


def add_e2e_args(p: argparse.ArgumentParser) -> None:
    """Options of ``bench e2e`` (shared with ``benchmarks/bench_e2e.py``)."""
    p.add_argument("--model", default="smollm2")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--prompt-lookup-min", type=int, default=1)
    p.add_argument("--prompt-lookup-max", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--samples", type=int, default=3, help="times each system runs the workload (median reported)"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--json", help="also write the report as JSON to this file")


def add_bench_parser(sub: Any) -> None:
    """``spec-backend bench e2e``."""
    p = sub.add_parser("bench", help="benchmarks")
    bench_sub = p.add_subparsers(dest="bench", required=True)
    e2e = bench_sub.add_parser("e2e", help="engine vs transformers generate, with and without speculation")
    add_e2e_args(e2e)
    e2e.set_defaults(func=cmd_bench_e2e)


def add_demo_parser(sub: Any) -> None:
    """``spec-backend demo``."""
    from spec_backend.tools.demo import add_demo_args, run_demo

    p = sub.add_parser("demo", help="SmolLM2 with plain decoding, ngram and suffix speculation side by side")
    add_demo_args(p)
    p.set_defaults(func=run_demo)
