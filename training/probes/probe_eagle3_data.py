"""Which training answers lift a trained EAGLE-3 head on chat? The same head, fine-tuned for the same
steps on answers to different prompts, scored by the chain metric
(``spec_backend_train.online.chain_acceptance``) on the benchmark's chat prompts and held-out instruction
prompts.

    python training/probes/probe_eagle3_data.py --head ~/.cache/spec_backend/smollm2-eagle3-6k-cont \
        --answers 128 --steps 40 --batch 8 --arms families,chat-ceiling

Arms (``--arms``), each answered by the float32 target (on ``--device``):

* ``families``: the last ``--answers`` training prompts of ``spec_backend_train.prompts.prompt_variants(8)``
  (what the head was trained on more of: the control), answered greedily;
* ``chat-ceiling``: the benchmark's own chat prompts, answered at temperature 0.8 with ``--answers``
  seeds spread over them. **Contaminated on purpose**: a diagnostic of how far the head can move on chat
  when its data is chat, never a way to train a head that ships;
* ``self``: prompts the target writes itself (``spec_backend_train.self_prompts``), answered greedily;
* ``new``: the prompts of ``spec_backend_train.prompts.FAMILIES`` that the head's training never asked
  (``--new-families``), answered greedily.

Each arm starts from the head's weights and draft vocabulary and takes ``--steps`` optimiser steps of
``--batch`` answers (lr ``--lr``, cosine), so the arms differ only in their answers. ``--arms ''`` scores
the head alone (what ``training/probes/gpu_train_eagle3.sh`` does after a run, there with ``--device cuda``).
``--by-confidence`` prints the head's first-draft agreement binned by the target's confidence instead;
``--full-vocab DIR`` first gives the head every target id to draft (``full_vocabulary_head``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))


def arm_prompts(
    arm: str, answers: int, new_families: list[str], target: Any, tokenizer: Any
) -> tuple[list[str], float]:
    """The prompts one arm answers, and the temperature it answers them at."""
    from bench_eagle3_smollm2 import CHAT
    from spec_backend_train.prompts import prompt_variants
    from spec_backend_train.self_prompts import self_prompts

    if arm == "families":
        return prompt_variants(8)[-answers:], 0.0
    if arm == "chat-ceiling":
        return [CHAT[i % len(CHAT)] for i in range(answers)], 0.8
    if arm == "new":
        return prompt_variants(1, families=new_families)[:answers], 0.0
    if arm == "self":
        asked, dropped = self_prompts(target, tokenizer, answers, seed=0)
        print(f"self-written: {len(asked)} kept, {dropped} dropped; first: {asked[:3]}", flush=True)
        return asked, 0.0
    raise SystemExit(f"unknown arm {arm!r}: choose from families, chat-ceiling, new, self")


def main() -> None:
    from probe_eagle3_qat import answerer, capture_for, fine_tune, scored_sets, trainer_for
    from spec_backend_train import online

    from spec_backend.runtime.loader import load_model, load_tokenizer
    from spec_backend.runtime.sources import resolve_model

    args = _parser().parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    source, device = resolve_model("smollm2"), torch.device(args.device)
    tokenizer, target = load_tokenizer(source), load_model(source, "sdpa", torch.float32, device)
    started = time.monotonic()
    answered = answerer(tokenizer, target)
    sets, capture = scored_sets(answered, args.n, args.max_tokens), capture_for(target)
    if args.full_vocab:
        args.head = full_vocabulary_head(args.head, target, args.full_vocab)
    if args.by_confidence:
        return by_confidence(trainer_for(args.head, target, False, args.lr, 0), capture, sets)
    news = [f for f in args.new_families.split(",") if f]
    print("| arm | answers (tokens) | instruct | chat |\n|---|---:|---:|---:|", flush=True)
    for arm in ["as trained", *[a for a in args.arms.split(",") if a]]:
        steps, train = 0, []
        if arm != "as trained":
            prompts, temperature = arm_prompts(arm, args.answers, news, target, tokenizer)
            train, steps = answered(prompts, 160, temperature)[0], args.steps
        trainer = trainer_for(args.head, target, False, args.lr, steps)
        fine_tune(trainer, capture, train, steps, args.batch)
        scores = [1 + sum(online.chain_acceptance(trainer, capture, *sets[s], 8)) for s in sets]
        size = f"{len(train)} ({sum(map(len, train))})"
        print(f"| {arm} | {size} | {scores[0]:.3f} | {scores[1]:.3f} |", flush=True)
    print(f"({time.monotonic() - started:.0f}s)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head", required=True)
    p.add_argument("--arms", default="families,chat-ceiling")
    p.add_argument("--new-families", default="", help="comma-separated family names for the new arm")
    p.add_argument("--answers", type=int, default=128)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--device", default="cpu", help="where the target (float32) and the head run")
    p.add_argument(
        "--by-confidence", action="store_true", help="the head's first-draft agreement by target confidence"
    )
    p.add_argument(
        "--full-vocab",
        default=None,
        help="first write the head with all target ids drafted to this folder, and use that head",
    )
    return p


def full_vocabulary_head(head: str, target: Any, out: str) -> str:
    """``head`` with every target id in its draft vocabulary: its trained LM-head rows are kept (draft
    ids unchanged) and each other id gets the target's LM-head row, rescaled by the target's final norm
    over the head's (logits = (norm weight * normalised state) . row)."""
    import json

    from safetensors.torch import load_file, save_file

    from spec_backend.runtime.hidden import decoder_of

    saved = load_file(os.path.join(head, "model.safetensors"))
    rows = target.get_output_embeddings().weight.detach().float().cpu()  # [V, H]
    kept = torch.arange(saved["d2t"].numel()) + saved["d2t"]  # [Vd] target ids drafted now
    added = (~saved["t2d"].bool()).nonzero().flatten()  # [V - Vd] the others, in id order
    ids = torch.cat([kept, added])  # [V]
    scale = decoder_of(target).norm.weight.detach().float().cpu() / saved["norm.weight"].float()  # [H]
    lm_head = torch.cat([saved["lm_head.weight"].float(), rows[added] * scale])  # [V, H]
    saved.update({"lm_head.weight": lm_head.to(torch.bfloat16), "d2t": ids - torch.arange(ids.numel()),
                  "t2d": torch.ones_like(saved["t2d"], dtype=torch.bool)})  # fmt: skip
    os.makedirs(out, exist_ok=True)
    save_file(saved, os.path.join(out, "model.safetensors"))
    with open(os.path.join(head, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump({**config, "draft_vocab_size": int(ids.numel())}, f, indent=2)
    return out


BINS = (0.0, 0.5, 0.8, 0.95, 1.0)


@torch.no_grad()
def by_confidence(trainer: Any, capture: Any, sets: dict[str, tuple[list[list[int]], list[int]]]) -> None:
    """The head's first draft against the answer's token, binned by the target's confidence in that token
    (its top-1 probability where it chose it): is a set harder because the head drafts it worse, or
    because the target itself is less sure of what it says there?"""
    from spec_backend_train import online

    from spec_backend.runtime.hidden import decoder_of

    print("| set | target top-1 p | share of rows | first draft agrees | not in draft vocabulary |")
    print("|---|---|---:|---:|---:|")
    inside_vocab = trainer.config.t2d.bool()  # [V] target ids the head can draft
    edges = torch.tensor(BINS[1:-1])
    for name, (seqs, starts) in sets.items():
        confidence, agree, drafted = [], [], []
        for seq, start in zip(seqs, starts, strict=True):
            tokens = torch.tensor([seq], device=trainer.device)  # [1, T]
            hidden = online.batch_states(trainer.target, capture, tokens, torch.tensor([len(seq)]))
            last = decoder_of(trainer.target).norm(hidden[0, :, trainer.columns[1]])  # [T, H]
            top = torch.softmax(trainer.target.get_output_embeddings()(last).float(), -1).amax(-1)  # [T]
            with torch.autocast(trainer.device.type, dtype=torch.bfloat16, enabled=trainer.config.bf16):
                drafts = trainer.ids[next(trainer.unroll(tokens, hidden))[0].argmax(-1)]  # [T] row t: t + 2
            rows = torch.arange(max(0, start - 2), len(seq) - 2)  # drafts of answer tokens
            confidence.append(top[rows + 1].cpu())
            agree.append((drafts[rows] == tokens[0, rows + 2]).cpu())
            drafted.append(inside_vocab[tokens[0, rows + 2].cpu()])
        conf, hit, oov = torch.cat(confidence), torch.cat(agree).float(), ~torch.cat(drafted)  # [rows]
        bins = torch.bucketize(conf, edges, right=True)  # [rows] 0 .. len(BINS) - 2
        for b in range(len(BINS) - 1):
            inside = bins == b
            share, rate = float(inside.float().mean()), float(hit[inside].mean()) if inside.any() else 0.0
            missing = float(oov[inside].float().mean()) if inside.any() else 0.0
            span = f"[{BINS[b]}, {BINS[b + 1]}{']' if b == len(BINS) - 2 else ')'}"
            print(f"| {name} | {span} | {share:.3f} | {rate:.3f} | {missing:.3f} |")
        mean = f"all ({len(hit)} rows, mean p {float(conf.mean()):.3f})"
        print(f"| {name} | {mean} | 1.000 | {float(hit.mean()):.3f} | {float(oov.float().mean()):.3f} |")


if __name__ == "__main__":
    main()
