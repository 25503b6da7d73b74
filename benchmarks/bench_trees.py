"""Token trees against chains at the same verify budget (#42): acceptance length and tokens per second.

Trained heads do not exist offline, so the head is constructed: the target is SmolLM2-135M-shaped (Llama,
hidden 576, 30 layers, 9 heads / 3 KV heads) with a 4096-token vocabulary and every layer's output
projections zeroed, so its next token depends on the current token alone and it still costs a full
forward; the head is a DeepSpec-format DSpark head whose Markov table holds that target's bigram table
with the two best tokens swapped after every other token (``--swap-every``), so its first choice is wrong
there and its second right — where trees are meant to help (``--head-scale`` below 1 flattens the
head's distribution: a draft less sure than the target, where multi-path verification is meant to
help). Reference backend (``--backend``: the cpu
backend's packed-layer path picks up the zeroed layers and changes the target). Greedy (or
``--temperature``), batch 1 and 4, one
prompt per request, ``--tokens`` new tokens; medians over ``--runs`` runs in this process, the plain
engine (no speculation) measured in the same run as the peer; ``ms/step``, the median over the runs of the
decode steps' mean wall time, reads the step's cost apart from prefill and the wave's start. Each row says
whether its steps replayed captured graphs (``--backend cuda``: the tree verify step is captured at 1 +
nodes tokens per request).

Rows: plain decoding; the chain of K=3 and of K=6 (the tree's verify budget); the 6-node tree
``[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]`` (depth 3); with ``--temperature`` above 0 (seeded
sampling) also the chain of K=3 with sampled drafts, the same chain under block verification, the tree
with sampled siblings, and 2 and 3 i.i.d. draft paths of 3 tokens (``tree_paths``, at most 6 and 9 nodes)
verified by greedy multi-path block verification. Run: ``python benchmarks/bench_trees.py
[--temperature 1.0]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

TREE = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"
SHAPE = {
    "vocab_size": 4096,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 2048,
}


def build(root: Path, swap_every: int, head_scale: float = 1.0) -> tuple[str, str]:
    """The bigram target and the constructed DSpark head (module docstring); ``head_scale`` multiplies
    the head's table (below 1: a draft flatter than the target, ``q ∝ p^scale`` up to the swaps)."""
    import torch
    from safetensors.torch import load_file, save_file

    from spec_backend.testing.fixtures.dspark_checkpoints import make_bigram_target, write_exact_dspark

    target = make_bigram_target(root / "target", vocab=SHAPE["vocab_size"], seed=0, **_sizes())
    head = write_exact_dspark(root / "head", target, block_size=6)
    path = os.path.join(head, "model.safetensors")
    tensors = load_file(path)
    w2 = tensors["markov_head.markov_w2.weight"]  # [V, V]
    for prev in range(0, w2.shape[1], swap_every):
        top = torch.topk(w2[:, prev], 2).indices
        w2[top[0], prev], w2[top[1], prev] = w2[top[1], prev].clone(), w2[top[0], prev].clone()
    w2.mul_(head_scale)
    save_file(tensors, path)
    return target, head


def _sizes() -> dict[str, Any]:
    return {k: v for k, v in SHAPE.items() if k != "vocab_size"}


def measure(
    target: str, spec: dict[str, Any] | None, batch: int, args: argparse.Namespace
) -> tuple[float, float, float, float, str]:
    """(median tokens/s, mean acceptance length, verified draft tokens per step, median ms per decode
    step, graphs on or eager). The warm-up is the timed wave itself (every graph size and kernel met)."""
    from spec_backend import LLM, SamplingParams
    from spec_backend.testing.host_reads import decode_step_seconds

    tokens, backend = args.tokens, args.backend
    llm = LLM(target, speculative_config=spec, max_num_seqs=batch, log_stats_interval=None, backend=backend)
    graphs = "graphs on" if llm.engine.captured is not None else "eager"
    prompts = [[(7 * b + 3 * i) % SHAPE["vocab_size"] for i in range(32)] for b in range(batch)]
    params = [
        SamplingParams(temperature=args.temperature, seed=b, max_tokens=tokens, ignore_eos=True)
        for b in range(batch)
    ]
    llm.generate(prompts, params)  # warm-up
    rates, step_ms = [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        with decode_step_seconds(llm) as steps:
            llm.generate(prompts, params)
        rates.append(batch * tokens / (time.perf_counter() - start))
        step_ms.append(1e3 * sum(steps) / max(len(steps), 1))
    total = llm.metrics.total
    per_step = total.num_draft_tokens / total.num_drafts if total.num_drafts else 0.0
    return (
        statistics.median(rates),
        total.mean_acceptance_length,
        per_step,
        statistics.median(step_ms),
        graphs,
    )


def table(head: str, temperature: float) -> dict[str, dict[str, Any] | None]:
    """The rows (module docstring): chains draft K every step (``adaptive_draft_length`` off: the same
    verify budget each step); above temperature 0 the chain and the tree again with sampled drafts
    (``rejection_sample_method='probabilistic'``: the chain's drafts and the tree's siblings drawn from
    the head's distribution and verified with it), block verification of the chain, and i.i.d. paths
    verified by GBV."""
    chain = {"model": head, "adaptive_draft_length": False}
    tree = {"model": head, "num_speculative_tokens": 3, "speculative_token_tree": TREE}
    rows: dict[str, dict[str, Any] | None] = {
        "plain (peer)": None,
        "chain K=3": {**chain, "num_speculative_tokens": 3},
        "chain K=6": {**chain, "num_speculative_tokens": 6},
        "tree 6 nodes, depth 3": tree,
    }
    if temperature > 0:
        sampled = {"rejection_sample_method": "probabilistic"}
        rows["chain K=3, sampled drafts"] = {**chain, "num_speculative_tokens": 3, **sampled}
        rows["chain K=3, block verif."] = {
            **chain,
            "num_speculative_tokens": 3,
            "rejection_sample_method": "block",
        }
        rows["tree, sampled siblings"] = {**tree, **sampled}
        rows["2 paths of 3, GBV"] = {**chain, "num_speculative_tokens": 3, "tree_paths": 2, **sampled}
        rows["3 paths of 3, GBV"] = {**chain, "num_speculative_tokens": 3, "tree_paths": 3, **sampled}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 4])
    parser.add_argument("--swap-every", type=int, default=2)
    parser.add_argument(
        "--head-scale", type=float, default=1.0, help="< 1: a draft flatter than the target (q ∝ p^scale)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", default="reference", help="the cpu backend packs the zeroed layers")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="> 0: seeded sampling, and the sampled-siblings rows"
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        target, head = build(Path(tmp), args.swap_every, args.head_scale)
        rows = table(head, args.temperature)
        print(
            f"temperature {args.temperature}, head scale {args.head_scale}, {args.tokens} new tokens, "
            f"{args.runs} runs, float32, "
            f"{args.threads} threads, torch {torch.__version__}"
        )
        print(
            f"{'batch':>5} {'row':<24} {'tok/s':>8} {'x plain':>8} {'accept len':>11} {'verified/step':>14}"
            f" {'ms/step':>8}  step"
        )
        for batch in args.batches:
            plain = None
            for name, spec in rows.items():
                rate, length, per_step, ms, graphs = measure(target, spec, batch, args)
                plain = rate if plain is None else plain
                ratio = rate / plain
                cells = f"{rate:>8.1f} {ratio:>8.2f} {length:>11.2f} {per_step:>14.2f} {ms:>8.2f}"
                print(f"{batch:>5} {name:<24} {cells}  {graphs}")


if __name__ == "__main__":
    main()
