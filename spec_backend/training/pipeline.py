"""``spec-backend train-eagle3``: corpus → extracted hidden states → draft vocabulary → TTT → head.

Every stage writes under ``--work`` and is skipped when its output is already there, so an interrupted
run resumes: extraction keeps an index of finished sequences, training saves the head and optimiser after
each epoch. The result is written to ``--out`` in the ``speculators`` format (bfloat16 by default), ready
for ``speculative_config={"model": OUT}``. Deterministic for a given ``--seed`` on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class PipelineConfig:
    """The run's settings (``spec-backend train-eagle3 --help`` describes each)."""

    target: str
    out_dir: str
    work_dir: str
    num_sequences: int = 400
    max_len: int = 512
    draft_vocab_size: int = 8192
    ttt_steps: int = 3
    epochs: int = 2
    lr: float = 3e-4
    seed: int = 0
    packages: tuple[str, ...] = ()


def _target_sizes(target: str) -> tuple[int, int]:
    """(decoder layers, vocabulary size) of the target, from its config alone."""
    from transformers import AutoConfig

    from spec_backend.engine.loader import resolve_model

    source = resolve_model(target)
    text = AutoConfig.from_pretrained(source.directory, gguf_file=source.gguf_file).get_text_config()
    return int(text.num_hidden_layers), int(text.vocab_size)


def _extract_all(
    config: PipelineConfig, sequences: list[list[int]], layer_ids: list[int], log: Callable[[str], None]
) -> list[str]:
    from spec_backend.training.data import extract_with, extractor

    index_path = os.path.join(config.work_dir, "extracted.json")
    done: list[str] = []
    if os.path.exists(index_path):
        with open(index_path, encoding="utf-8") as f:
            done = json.load(f)
    llm = None  # one engine for every batch (loading the target is the slow part)
    for start in range(len(done), len(sequences), 32):
        if llm is None:
            llm = extractor(config.target, os.path.join(config.work_dir, "states"), layer_ids)
        done += extract_with(llm, sequences[start : start + 32])
        with open(index_path, "w", encoding="utf-8") as f:
            json.dump(done, f)
        log(f"extracted {len(done)}/{len(sequences)} sequences")
    return done[: len(sequences)]


def run(config: PipelineConfig, log: Callable[[str], None] = print) -> str:
    """Run (or resume) the pipeline; returns the output folder."""
    import torch

    from spec_backend.engine.loader import load_tokenizer, resolve_model
    from spec_backend.models.eagle3 import default_aux_layer_ids
    from spec_backend.training import corpus
    from spec_backend.training.data import load
    from spec_backend.training.eagle3 import Eagle3Trainer, TrainConfig
    from spec_backend.training.vocab import draft_vocabulary

    os.makedirs(config.work_dir, exist_ok=True)
    with open(os.path.join(config.work_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(asdict(config), f, indent=2)
    tokenizer: Any = load_tokenizer(resolve_model(config.target))
    if tokenizer is None:
        raise ValueError(f"train-eagle3 needs a target with a tokenizer, {config.target!r} has none")
    packages = config.packages or corpus.DEFAULT_PACKAGES
    train, _ = corpus.split_corpus(tokenizer, config.num_sequences, 0, config.max_len, packages)
    layers, vocab = _target_sizes(config.target)
    aux = default_aux_layer_ids(layers)
    state_ids = tuple(sorted({*aux, layers}))  # distinct ids (the default aux ids repeat on small targets)
    files = _extract_all(config, train, list(state_ids), log)
    counts = torch.zeros(vocab, dtype=torch.int64)  # [V] token frequencies of the training text
    for path in files:
        counts += torch.bincount(load(path)[0], minlength=vocab)[:vocab]
    d2t, t2d = draft_vocabulary(counts, min(config.draft_vocab_size, counts.numel()))
    trainer = Eagle3Trainer(
        config.target, TrainConfig(aux, d2t, t2d, config.ttt_steps, config.lr, config.seed, state_ids)
    )
    state_path = os.path.join(config.work_dir, "trainer.pt")
    for epoch in range(trainer.restore(state_path), config.epochs):
        losses = trainer.train(files, max_len=config.max_len, progress=_progress(log, epoch, len(files)))
        trainer.checkpoint(state_path, epoch + 1)
        log(f"epoch {epoch + 1}/{config.epochs}: mean loss {sum(losses) / max(1, len(losses)):.4f}")
    return trainer.save(config.out_dir, dtype=torch.bfloat16)


def _progress(log: Callable[[str], None], epoch: int, total: int) -> Callable[[int, float], None]:
    def report(step: int, loss: float) -> None:
        if step % 25 == 0 or step == total:
            log(f"epoch {epoch + 1} step {step}/{total} loss {loss:.4f}")

    return report


def add_parser(sub: Any) -> None:
    """Register ``train-eagle3`` on the CLI (no torch import until it runs)."""
    p = sub.add_parser("train-eagle3", help="train an EAGLE-3 head for a target from offline text")
    p.add_argument("--target", default="smollm2", help="target model (folder, GGUF or smollm2)")
    p.add_argument("--out", required=True, help="output folder (speculators format)")
    p.add_argument("--work", required=True, help="working folder (extracted states, checkpoints; resumable)")
    p.add_argument("--sequences", type=int, default=400, help="training sequences")
    p.add_argument("--max-len", type=int, default=512, help="tokens per sequence")
    p.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary size")
    p.add_argument("--ttt", type=int, default=3, help="training-time-test steps (drafts trained ahead)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd)


def _cmd(args: argparse.Namespace) -> int:
    config = PipelineConfig(
        args.target,
        args.out,
        args.work,
        args.sequences,
        args.max_len,
        args.draft_vocab,
        args.ttt,
        args.epochs,
        args.lr,
        args.seed,
    )
    print(f"wrote {run(config)}")
    return 0


__all__ = ["PipelineConfig", "add_parser", "run"]
