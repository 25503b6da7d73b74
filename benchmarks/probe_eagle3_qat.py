"""Does quantization-aware training close a head's int4 gap? A short fine-tune of a trained EAGLE-3 head
for the bundled SmolLM2, with and without QAT (``training.quant``), scored by the chain metric
(``training.online.chain_acceptance``) with float and int4 weights.

    python benchmarks/probe_eagle3_qat.py --head ~/.cache/spec_backend/smollm2-eagle3-gpu1 \
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
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))


def trainer_for(head: str, target: Any, qat: bool, lr: float, steps: int) -> Any:
    from safetensors.torch import load_file

    from spec_backend.training.eagle3 import Eagle3Trainer, TrainConfig, layer_ids

    saved = load_file(os.path.join(head, "model.safetensors"))
    aux, ids = layer_ids(int(target.config.get_text_config().num_hidden_layers))
    config = TrainConfig(aux, saved["d2t"].long(), saved["t2d"].bool(), 3, lr, 0, ids, steps,
                         bf16=True, init_head=head, qat_int4=qat)  # fmt: skip
    return Eagle3Trainer("smollm2", config, target=target)


def main() -> None:
    from bench_eagle3_smollm2 import CHAT

    from spec_backend.engine.hidden import HiddenCapture
    from spec_backend.engine.loader import load_model, load_tokenizer, resolve_model
    from spec_backend.proposers.contract import HiddenStateRequest
    from spec_backend.training import online
    from spec_backend.training.eagle3 import layer_ids
    from spec_backend.training.prompts import instruction_prompts, prompt_variants
    from spec_backend.training.quant import int4_linears, int4_weights

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
    started = time.monotonic()

    def answered(prompts: list[str], tokens: int) -> tuple[list[list[int]], list[int]]:
        encoded = online.encode_chats(tokenizer, prompts)
        seqs = [s for first in range(0, len(encoded), 32)
                for s in online.answer(target, encoded[first : first + 32], tokens, 0.0, 0, 2)]  # fmt: skip
        return seqs, [len(e) for e in encoded]

    train, _ = answered(prompt_variants(8)[-args.answers :], 160)  # the last variants: least seen in training
    sets = {"instruct": answered(instruction_prompts(held_out=True)[: args.n], args.max_tokens),
            "chat": answered(CHAT[: args.n], args.max_tokens)}  # fmt: skip
    print(f"{len(train)} answers in {time.monotonic() - started:.0f}s", flush=True)
    layers = int(target.config.get_text_config().num_hidden_layers)
    capture = HiddenCapture(target, HiddenStateRequest(aux_layer_ids=layer_ids(layers)[1]), layers)
    print("| variant | set | float | int4 |\n|---|---|---:|---:|")
    for name, qat, steps in (
        ("as trained", False, 0),
        ("fine-tuned", False, args.steps),
        ("fine-tuned, QAT", True, args.steps),
    ):
        trainer = trainer_for(args.head, target, qat, args.lr, steps)
        batches = online.epochs_of(train, args.batch, steps * args.batch // max(1, len(train)) + 1, 0)
        for _, (tokens, lengths) in zip(range(steps), batches, strict=False):
            trainer.step(tokens, online.batch_states(target, capture, tokens, lengths), lengths)
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
