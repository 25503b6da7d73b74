"""Does quantization-aware training close a head's int4 gap? A short fine-tune of a trained EAGLE-3 head
for the bundled SmolLM2, with and without QAT (``spec_backend_train.quant``), scored by the chain metric
(``spec_backend_train.online.chain_acceptance``) with float and int4 weights.

    python training/probes/probe_eagle3_qat.py --head ~/.cache/spec_backend/smollm2-eagle3-gpu1 \
        --answers 128 --steps 40 --batch 8 --save /tmp/qat-heads

The target (float32, CPU) answers ``--answers`` training prompts greedily; each variant then takes
``--steps`` optimiser steps of ``--batch`` answers from the same start (the head's weights and draft
vocabulary) and the same data order, so the two differ only in QAT. Scored on the first ``--n``
held-out instruction prompts and the benchmark's chat prompts, answered greedily (``--max-tokens``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))


def trainer_for(head: str, target: Any, qat: bool, lr: float, steps: int) -> Any:
    from safetensors.torch import load_file
    from spec_backend_train.eagle3 import Eagle3Trainer, TrainConfig, layer_ids

    saved = load_file(os.path.join(head, "model.safetensors"))
    aux, ids = layer_ids(int(target.config.get_text_config().num_hidden_layers))
    config = TrainConfig(aux, saved["d2t"].long(), saved["t2d"].bool(), 3, lr, 0, ids, steps,
                         bf16=True, init_head=head, qat_int4=qat)  # fmt: skip
    return Eagle3Trainer("smollm2", config, target=target)


Answered = Callable[[list[str], int, float], tuple[list[list[int]], list[int]]]


def answerer(tokenizer: Any, target: Any) -> Answered:
    """``answered(prompts, max_tokens, temperature)``: the target's answers (prompt and response) to
    chat-formatted ``prompts``, 32 at a time (seed = batch number), and each prompt's length."""
    from spec_backend_train import online

    def answered(prompts: list[str], tokens: int, temperature: float) -> tuple[list[list[int]], list[int]]:
        encoded = online.encode_chats(tokenizer, prompts)
        seqs = []
        for i, first in enumerate(range(0, len(encoded), 32)):
            seqs += online.answer(target, encoded[first : first + 32], tokens, temperature, i, 2)
        return seqs, [len(e) for e in encoded]

    return answered


def scored_sets(answered: Answered, n: int, max_tokens: int) -> dict[str, tuple[list[list[int]], list[int]]]:
    """The first ``n`` held-out instruction prompts and the benchmark's chat prompts, answered greedily."""
    from bench_eagle3_smollm2 import CHAT
    from spec_backend_train.prompts import instruction_prompts

    held_out = instruction_prompts(held_out=True)[:n]
    return {"instruct": answered(held_out, max_tokens, 0.0), "chat": answered(CHAT[:n], max_tokens, 0.0)}


def capture_for(target: Any) -> Any:
    """The hooks that capture the states a trainer reads (``spec_backend_train.eagle3.layer_ids``)."""
    from spec_backend_train.eagle3 import layer_ids

    from spec_backend.runtime.hidden import HiddenCapture
    from spec_backend.step import HiddenStateRequest

    layers = int(target.config.get_text_config().num_hidden_layers)
    return HiddenCapture(target, HiddenStateRequest(aux_layer_ids=layer_ids(layers)[1]), layers)


def fine_tune(trainer: Any, capture: Any, train: Sequence[list[int]], steps: int, batch: int) -> None:
    """``steps`` optimiser steps on batches of ``batch`` answers, in a fixed order (seed 0) per epoch."""
    from spec_backend_train import online

    batches = online.epochs_of(train, batch, steps * batch // max(1, len(train)) + 1, 0)
    for _, (tokens, lengths) in zip(range(steps), batches, strict=False):
        tokens, lengths = tokens.to(trainer.device), lengths.to(trainer.device)
        trainer.step(tokens, online.batch_states(trainer.target, capture, tokens, lengths), lengths)


def main() -> None:
    from spec_backend_train import online
    from spec_backend_train.prompts import prompt_variants
    from spec_backend_train.quant import int4_linears, int4_weights

    from spec_backend.runtime.loader import load_model, load_tokenizer
    from spec_backend.runtime.sources import resolve_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head", required=True)
    p.add_argument("--answers", type=int, default=512)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--save", default=None, help="write each fine-tuned head under this folder (for the bench)"
    )
    args = p.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    source = resolve_model("smollm2")
    tokenizer, target = load_tokenizer(source), load_model(source, "sdpa", torch.float32, torch.device("cpu"))
    started, answered = time.monotonic(), answerer(tokenizer, target)
    train, _ = answered(prompt_variants(8)[-args.answers :], 160, 0.0)  # the last variants: least seen
    sets = scored_sets(answered, args.n, args.max_tokens)
    print(f"{len(train)} answers in {time.monotonic() - started:.0f}s", flush=True)
    capture = capture_for(target)
    print("| variant | set | float | int4 |\n|---|---|---:|---:|")
    for name, qat, steps in (
        ("as trained", False, 0),
        ("fine-tuned", False, args.steps),
        ("fine-tuned, QAT", True, args.steps),
    ):
        trainer = trainer_for(args.head, target, qat, args.lr, steps)
        fine_tune(trainer, capture, train, steps, args.batch)
        for set_name, (seqs, starts) in sets.items():
            floats = online.chain_acceptance(trainer, capture, seqs, starts, 8)
            with int4_weights(int4_linears(trainer.head)):
                int4 = online.chain_acceptance(trainer, capture, seqs, starts, 8)
            print(f"| {name} | {set_name} | {1 + sum(floats):.3f} | {1 + sum(int4):.3f} |", flush=True)
        if args.save and steps:
            trainer.save(os.path.join(args.save, "qat" if qat else "plain"), dtype=torch.bfloat16)
    print(f"({time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    main()
