"""What each drafting method costs per step, as a fraction of one target verify forward.

Trained heads do not exist offline, so acceptance cannot be measured here; this benchmark measures the
other side of the speed-up: the drafter's time per step (catch-up on the committed rows + K drafts),
against the time of the target forward that verifies K+1 tokens, in the same run and process.

Target: random weights in SmolLM2-135M's shape (Llama, hidden 576, 30 layers, 9 heads / 3 KV heads,
vocabulary 49152, tied embeddings), float32. MTP needs its layers inside the target checkpoint, so it
runs on a GLM-4.5-style target of the same sizes (dense MLPs, one MTP layer) and is compared with that
target's own forward. Heads are random checkpoints in their published formats
(``spec_backend.testing.fixtures.draft_checkpoints``); ``draft_model`` is a 2-layer model of the same
shape; ``dspark`` is a DeepSpec-format head (vanilla Markov head of rank 256, every draft verified). The
EAGLE-3 head also runs with ``speculative_config["quantization"]`` int8 and int4 (drafts only;
int4 on the cpu backend runs its first layer as one native call, ``cpu/native_eagle3.py``).

Method: one request (a 64-token random prompt), greedy, ``--tokens`` new tokens, K = ``--k``; the
drafter's ``propose`` and the runner's ``forward`` are timed around each call; the prefill step is
dropped; medians over the decode steps. Random heads are rarely accepted, so almost every step verifies
K+1 tokens and drafts K — the full per-step cost. Run: ``python benchmarks/bench_drafter_cost.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SMOLLM2 = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
}


def glm_target(path: Path) -> str:
    """SmolLM2-sized GLM-4.5-style checkpoint (dense MLPs) with one MTP layer at model.layers.30."""

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    sizes = {k: v for k, v in SMOLLM2.items() if k != "num_hidden_layers"}
    config = Glm4MoeConfig(num_hidden_layers=31, first_k_dense_replace=100, head_dim=64, **sizes)
    torch.manual_seed(0)
    Glm4MoeForCausalLM(config).save_pretrained(str(path))
    tensors = load_file(str(path / "model.safetensors"))
    h = SMOLLM2["hidden_size"]
    tensors |= {
        "model.layers.30.enorm.weight": torch.ones(h),
        "model.layers.30.hnorm.weight": torch.ones(h),
        "model.layers.30.eh_proj.weight": torch.randn(h, 2 * h) * (2 * h) ** -0.5,
        "model.layers.30.shared_head.norm.weight": torch.ones(h),
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((path / "config.json").read_text())
    raw.update({"num_hidden_layers": 30, "num_nextn_predict_layers": 1})
    (path / "config.json").write_text(json.dumps(raw))
    return str(path)


def pard_draft(draft: str) -> str:
    """The same 2-layer draft declared as a PARD model (``pard_token`` in its config)."""
    path = Path(draft).with_name("pard")
    shutil.copytree(draft, path)
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "pard_token": 0}))
    return str(path)


def checkpoints(root: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """method -> (target folder, speculative_config without K)."""
    from spec_backend.testing.fixtures import draft_checkpoints as w
    from spec_backend.tools.tiny import make_tiny_model

    target = make_tiny_model(root / "target", "llama", **SMOLLM2)
    draft = make_tiny_model(root / "draft", "llama", **{**SMOLLM2, "num_hidden_layers": 2})
    h, v = SMOLLM2["hidden_size"], SMOLLM2["vocab_size"]
    eagle3 = w.write_eagle3(root / "eagle3", target, "original", draft_vocab=8192)
    return {
        "ngram": (target, {"method": "ngram", "prompt_lookup_max": 3}),
        "draft_model (2 layers)": (target, {"method": "draft_model", "model": draft}),
        "draft_model PARD": (
            target,
            {"method": "draft_model", "model": pard_draft(draft), "parallel_drafting": True},
        ),
        "eagle": (target, {"method": "eagle", "model": w.write_eagle1(root / "eagle", target, bias=False)}),
        "eagle3 (Vd 8192)": (target, {"method": "eagle3", "model": eagle3}),
        "eagle3 int8 weights": (target, {"method": "eagle3", "model": eagle3, "quantization": "int8"}),
        "eagle3 int4 (native)": (target, {"method": "eagle3", "model": eagle3, "quantization": "int4"}),
        "eagle3 parallel (P-EAGLE)": (
            target,
            {
                "method": "eagle3",
                "model": w.write_eagle3(root / "peagle", target, "peagle", draft_vocab=8192),
            },
        ),
        "dflash (2 layers)": (target, {"method": "dflash", "model": w.write_dflash(root / "dflash", target)}),
        "dspark (2 layers, r 256)": (
            target,
            {"method": "dspark", "model": dspark_head(root / "dspark", target)},
        ),
        "medusa": (target, {"method": "medusa", "model": w.write_medusa(root / "medusa", h, v, 5, "vllm")}),
        "mlp_speculator": (
            target,
            {
                "method": "mlp_speculator",
                "model": w.write_mlp_speculator(root / "mlp", h, v, 1024, 5, tied=False),
            },
        ),
        "mtp (GLM-style target)": (glm_target(root / "glm"), {"method": "mtp"}),
    }


def dspark_head(path: Path, target: str) -> str:
    """A DeepSpec-format DSpark head (2 layers, vanilla Markov head of DeepSpec's rank 256, confidence
    head); its confidence bias is raised so every draft is verified: the full cost per step."""
    from safetensors.torch import load_file, save_file

    from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark

    head = write_dspark(path, target, target_layer_ids=[1, 14], block_size=4, rank=256)
    tensors = load_file(f"{head}/model.safetensors")
    tensors["confidence_head.proj.bias"].fill_(30.0)
    save_file(tensors, f"{head}/model.safetensors")
    return head


def measure(target: str, spec: dict[str, Any], k: int, tokens: int) -> tuple[float, float, float]:
    """(median drafter ms per step, median verify-forward ms per step, mean drafts per step)."""
    import torch

    from spec_backend import LLM, SamplingParams

    llm = LLM(
        target,
        speculative_config={**spec, "num_speculative_tokens": k},
        max_num_seqs=1,
        log_stats_interval=None,
    )
    engine: Any = llm.engine
    draft_ms: list[float] = []
    verify_ms: list[float] = []
    drafted: list[int] = []

    def timed(fn: Any, sink: list[float], after: Any = None) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            sink.append((time.perf_counter() - start) * 1e3)
            if after is not None:
                after(out)
            return out

        return wrapper

    engine.drafter.propose = timed(
        engine.drafter.propose, draft_ms, lambda o: drafted.append(sum(o.num_draft_tokens))
    )
    engine.runner.forward = timed(engine.runner.forward, verify_ms)
    prompt = torch.randint(
        0, SMOLLM2["vocab_size"] - 1, (64,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    return statistics.median(draft_ms[1:]), statistics.median(verify_ms[1:]), statistics.mean(drafted[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", nargs="*", help="only the rows whose name starts with one of these")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        cases = checkpoints(Path(tmp))
        print(
            f"K={args.k}, {args.tokens} new tokens, batch 1, float32, {args.threads} threads, "
            f"torch {torch.__version__}"
        )
        print(
            f"{'method':<24} {'draft ms/step':>14} {'verify ms/step':>15} "
            f"{'draft/verify':>13} {'drafts/step':>12}"
        )
        for name, (target, spec) in cases.items():
            if args.methods and not any(name.startswith(m) for m in args.methods):
                continue
            draft, verify, drafted = measure(target, spec, args.k, args.tokens)
            print(f"{name:<24} {draft:>14.2f} {verify:>15.2f} {draft / verify:>13.3f} {drafted:>12.2f}")


if __name__ == "__main__":
    main()
