"""What limits an EAGLE-3 head for SmolLM2: short training runs on extracted states, scored on held-out ones.

Reads the work folder of a ``spec-backend train-eagle3`` run (its ``extracted.json``: source chats first,
then the target's answers to instruction prompts), trains a fresh head on ``--train`` answer sequences
for ``--epochs`` and prints, after each epoch, the mean loss and two held-out scores over the last
``--val`` answer sequences (never trained on):

* *step-0 agreement*: rows where the head's first draft equals the target's argmax (what greedy
  verification accepts at position 0);
* *chain-2*: rows where the first two drafts (the second fed the head's own first output) both agree.

Variants: ``--init-from-target``, ``--norm-before-fc``, ``--lr``, and ``--zero-features`` (the
auxiliary features replaced by zeros: a head that sees tokens only, the negative control that shows how
much the head uses the target's features). Example:
``python training/probes/probe_eagle3_training.py --work ~/.cache/spec_backend/eagle3-work
--init-from-target``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", required=True, help="a train-eagle3 work folder with extracted states")
    parser.add_argument("--answers-from", type=int, default=400, help="index of the first answer file")
    parser.add_argument("--train", type=int, default=200, help="answer files to train on")
    parser.add_argument("--val", type=int, default=40, help="held-out answer files (the last ones)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--init-from-target", action="store_true")
    parser.add_argument("--norm-before-fc", action="store_true")
    parser.add_argument("--zero-features", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def read(path: str, zero: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from spec_backend_train.data import load

    tokens, hidden = load(path)  # [T], [T, 4, H]: layers 2, 15, 27 (aux) and 30 (last)
    if zero:
        hidden = hidden.clone()
        hidden[:, :3] = 0.0
    return tokens, hidden


@torch.no_grad()
def score(trainer: Any, files: list[str], zero: bool) -> tuple[float, float]:
    """(step-0 agreement, chain-2 agreement) over ``files``."""
    first = chain = rows = 0
    for path in files:
        tokens, hidden = read(path, zero)
        length = tokens.numel()
        target = trainer.teacher(hidden[:, trainer.columns[1]].float()).argmax(-1)  # [T] draft ids
        steps = trainer.unroll(tokens, hidden)  # row t of step j predicts token t + 2 + j
        ok0 = next(steps).argmax(-1)[: length - 2] == target[1 : length - 1]  # [T - 2]
        ok1 = (next(steps).argmax(-1)[: length - 2] == target[2:]) & ok0
        first, chain, rows = first + int(ok0.sum()), chain + int(ok1.sum()), rows + length - 2
    return first / rows, chain / rows


def main() -> None:
    args = parse()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from spec_backend_train.data import load
    from spec_backend_train.eagle3 import Eagle3Trainer, TrainConfig, epoch_order
    from spec_backend_train.vocab import draft_vocabulary

    with open(os.path.join(args.work, "extracted.json"), encoding="utf-8") as f:
        files: list[str] = json.load(f)
    train = files[args.answers_from : args.answers_from + args.train]
    val = files[-args.val :]
    if set(train) & set(val):
        raise SystemExit(f"--train {args.train} overlaps the last {args.val} files used for scoring")
    counts = sum(torch.bincount(load(p)[0], minlength=49152) for p in files)  # [V]
    d2t, t2d = draft_vocabulary(torch.as_tensor(counts), 8192)
    config = TrainConfig(
        (2, 15, 27), d2t, t2d, 3, args.lr, 0, (2, 15, 27, 30), args.epochs * len(train),
        norm_before_fc=args.norm_before_fc, init_from_target=args.init_from_target, bf16=True,
    )  # fmt: skip
    trainer = Eagle3Trainer("smollm2", config)
    print(
        f"{vars(args)}\nbefore training: step-0 / chain-2 agreement {score(trainer, val, args.zero_features)}"
    )
    start = time.perf_counter()
    for epoch in range(args.epochs):
        losses = [
            trainer.step(*read(train[i], args.zero_features)) for i in epoch_order(len(train), 0, epoch)
        ]
        first, chain = score(trainer, val, args.zero_features)
        print(
            f"epoch {epoch + 1}: loss {sum(losses) / len(losses):.3f}, held-out step-0 agreement "
            f"{first:.3f}, chain-2 {chain:.3f} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
