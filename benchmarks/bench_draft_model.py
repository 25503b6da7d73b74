"""``draft_model`` end to end: the engine against transformers' assisted generation, same draft, one run.

Target: the bundled SmolLM2-135M-Instruct (GGUF, de-quantized to float32). Draft: the same model cut
to its first ``--draft-layers`` decoder layers (embeddings, final norm and LM head kept), saved once as a
safetensors folder under ``~/.cache/spec_backend/`` — a weak but honest draft that needs no download.
Systems, greedy, on the e2e benchmark's code-edit chat prompts, batch 1, interleaved prompt by prompt:

* transformers ``generate`` (plain) and ``generate(assistant_model=draft)`` with K constant draft tokens
  (``num_assistant_tokens_schedule="constant"``), on separately loaded copies of the target and draft;
* the engine without speculation, and with ``speculative_config={"method": "draft_model", ...}``.

Every system's tokens are compared with plain ``generate`` ("diff vs HF": requests whose tokens
differ). Acceptance length = 1 + accepted drafts per verification step (engine only). Tokens/s = new
tokens / wall time. Run: ``python benchmarks/bench_draft_model.py --threads 2``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any


def truncated_draft(layers: int) -> str:
    """A safetensors folder holding SmolLM2's first ``layers`` decoder layers (built once, cached)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from spec_backend.runtime.sources import resolve_model

    out = Path.home() / ".cache" / "spec_backend" / f"smollm2-first{layers}"
    if (out / "model.safetensors").exists():
        return str(out)
    source = resolve_model("smollm2")
    full = AutoModelForCausalLM.from_pretrained(
        source.directory, gguf_file=source.gguf_file, dtype=torch.float32
    )
    config = AutoConfig.for_model(
        **{k: v for k, v in full.config.to_dict().items() if k != "quantization_config"}
    )
    config.num_hidden_layers = layers
    draft = AutoModelForCausalLM.from_config(config)
    state = {
        k: v
        for k, v in full.state_dict().items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
    }
    draft.load_state_dict(state, strict=False)
    draft.tie_weights()
    draft.save_pretrained(out)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(source.directory, gguf_file=source.gguf_file).save_pretrained(out)
    return str(out)


def _hf(target: Any, draft: Any | None, prompts: list[list[int]], max_tokens: int, k: int) -> list[list[int]]:
    import torch

    outs = []
    for ids in prompts:
        x = torch.tensor([ids])
        extra: dict[str, Any] = {}
        if draft is not None:
            draft.generation_config.num_assistant_tokens = k
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0
            extra["assistant_model"] = draft
        y = target.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens, do_sample=False, **extra
        )
        outs.append(y[0, len(ids) :].tolist())
    return outs


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from spec_backend import LLM, SamplingParams
    from spec_backend.runtime.sources import resolve_model
    from spec_backend.tools.prompts import code_edit_prompts

    torch.set_num_threads(args.threads)
    draft_dir = truncated_draft(args.draft_layers)
    source = resolve_model("smollm2")
    hf_target = AutoModelForCausalLM.from_pretrained(source.directory, gguf_file=source.gguf_file).eval()
    hf_draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    spec = {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": args.k}
    plain, drafted = LLM("smollm2"), LLM("smollm2", speculative_config=spec)
    prompts = [
        plain.tokenizer(plain.chat_prompt(p))["input_ids"] for p in code_edit_prompts()[: args.prompts]
    ]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    systems: dict[str, Any] = {
        "transformers generate": lambda p: _hf(hf_target, None, [p], args.max_tokens, args.k)[0],
        f"transformers assisted (K={args.k})": lambda p: _hf(
            hf_target, hf_draft, [p], args.max_tokens, args.k
        )[0],
        "engine, no speculation": lambda p: plain.generate([p], params)[0].outputs[0].token_ids,
        f"engine, draft_model K={args.k}": lambda p: drafted.generate([p], params)[0].outputs[0].token_ids,
    }
    outs: dict[str, list[list[int]]] = {name: [] for name in systems}
    secs = dict.fromkeys(systems, 0.0)
    with torch.inference_mode():
        for p in prompts:
            for name, fn in systems.items():
                t0 = time.perf_counter()
                outs[name].append(fn(p))
                secs[name] += time.perf_counter() - t0
    total = drafted.metrics.total
    return {
        "outs": outs,
        "secs": secs,
        "acceptance": 1 + total.num_accepted_tokens / max(total.num_drafts, 1),
    }


def report(result: dict[str, Any], args: argparse.Namespace) -> str:
    outs, secs = result["outs"], result["secs"]
    ref = outs["transformers generate"]
    tps = {n: sum(len(o) for o in outs[n]) / secs[n] for n in outs}
    lines = [
        f"draft: SmolLM2 first {args.draft_layers} layers; K={args.k}; {len(ref)} prompts; "
        f"max_tokens={args.max_tokens}; engine acceptance length {result['acceptance']:.2f}",
        "| system | tokens/s | diff vs HF |",
        "|---|---:|---:|",
    ]
    for name in outs:
        diff = sum(a != b for a, b in zip(outs[name], ref, strict=True))
        lines.append(f"| {name} | {tps[name]:.2f} | {diff} |")
    names = list(outs)
    lines.append(f"ratio engine draft_model / transformers assisted: {tps[names[3]] / tps[names[1]]:.2f}x")
    lines.append(f"ratio engine draft_model / engine plain: {tps[names[3]] / tps[names[2]]:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--draft-layers", type=int, default=26)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    print(report(run(args), args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
