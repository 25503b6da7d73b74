"""``spec-backend train-eagle3``: text → extracted hidden states → draft vocabulary → TTT → head.

The text is ``--sequences`` chats cut from installed packages' sources (``corpus``; none by default:
the head drafts answers, so the default spends training time on answers) followed by the target's own
answers to ``--chats`` instruction prompts (``prompts``, answered greedily and at temperature 0.8 in
turn, ``--chat-tokens`` at most).

Every stage writes under ``--work`` and is skipped when its output is already there, so an interrupted
run resumes: extraction keeps an index of finished sequences, training saves the head and optimiser after
each epoch. The result is written to ``--out`` in the ``speculators`` format (bfloat16 by default), ready
for ``speculative_config={"model": OUT}``. Deterministic for a given ``--seed`` on one machine.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from spec_backend_train.args_check import check_arguments, check_target, families_of, target_sizes
from spec_backend_train.prompts import CORE


@dataclass(frozen=True)
class PipelineConfig:
    """The run's settings (``spec-backend train-eagle3 --help`` describes each)."""

    target: str
    out_dir: str
    work_dir: str
    num_sequences: int = 0
    max_len: int = 512
    draft_vocab_size: int = 8192
    ttt_steps: int = 3
    epochs: int = 3
    lr: float = 1.5e-3
    seed: int = 0
    packages: tuple[str, ...] = ()
    chats: int = 6000
    chat_tokens: int = 160
    bf16: bool = True
    init_from_target: bool = True
    init_head: str | None = None  # continue from a trained head (speculators folder, same draft vocabulary)

    def __post_init__(self) -> None:
        """The command line's checks (``args_check.check_numbers``) for a config built in Python too:
        every bad field named with its value, in one ``ValueError``."""
        least = {"num_sequences": 0, "max_len": 1, "draft_vocab_size": 1, "ttt_steps": 1, "epochs": 1,
                 "chats": 0, "chat_tokens": 1}  # fmt: skip
        bad = [
            f"{k} must be at least {v}, got {getattr(self, k)}"
            for k, v in least.items()
            if getattr(self, k) < v
        ]
        if not (math.isfinite(self.lr) and self.lr > 0):
            bad.append(f"lr must be a finite number above 0, got {self.lr}")
        if bad:
            raise ValueError("; ".join(bad))


def _resumable(
    path: str, total: int, batch: int, work: Callable[[int, int], list[Any]], log: Callable[[int], None]
) -> list[Any]:
    """Results ``0 .. total-1`` kept in the JSON list at ``path``: the missing ones are made ``batch`` at
    a time by ``work(start, stop)`` and saved after each batch, so an interrupted run resumes."""
    done: list[Any] = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            done = json.load(f)
    for start in range(len(done), total, batch):
        done += work(start, min(start + batch, total))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(done, f)
        log(len(done))
    return done[:total]


def _extract_all(
    config: PipelineConfig, sequences: list[list[int]], layer_ids: list[int], log: Callable[[str], None]
) -> list[str]:
    from spec_backend_train.data import extract_with, extractor

    @functools.cache
    def engine() -> Any:  # one engine for every batch (loading the target is the slow part)
        return extractor(config.target, os.path.join(config.work_dir, "states"), layer_ids)

    return _resumable(
        os.path.join(config.work_dir, "extracted.json"),
        len(sequences),
        32,
        lambda start, stop: extract_with(engine(), sequences[start:stop]),
        lambda n: log(f"extracted {n}/{len(sequences)} sequences"),
    )


def _respond_all(config: PipelineConfig, log: Callable[[str], None]) -> list[list[int]]:
    """The target's own answers to ``config.chats`` instruction prompts (``spec_backend_train.prompts``),
    kept in ``responses.json`` under the work folder and extended 64 prompts at a time (resumable)."""
    from spec_backend.engine import LLM
    from spec_backend_train.data import respond
    from spec_backend_train.prompts import instruction_prompts

    available = instruction_prompts()
    if not 0 <= config.chats <= len(available):
        raise ValueError(
            f"--chats must be in [0, {len(available)}] "
            f"(the instruction prompts of spec_backend_train.prompts), got {config.chats}"
        )
    prompts = available[: config.chats]

    @functools.cache
    def engine() -> Any:
        return LLM(config.target, max_num_seqs=64, log_stats_interval=None)

    def answer(start: int, stop: int) -> list[list[int]]:
        answers = respond(engine(), prompts[start:stop], config.chat_tokens, config.seed + start)
        return [ids[: config.max_len] for ids in answers]

    return _resumable(
        os.path.join(config.work_dir, "responses.json"),
        len(prompts),
        64,
        answer,
        lambda n: log(f"answered {n}/{len(prompts)} instruction prompts"),
    )


def run(config: PipelineConfig, log: Callable[[str], None] = print) -> str:
    """Run (or resume) the pipeline; returns the output folder."""
    import torch

    from spec_backend.runtime.loader import load_tokenizer
    from spec_backend.runtime.sources import resolve_model
    from spec_backend_train import corpus
    from spec_backend_train.data import load
    from spec_backend_train.eagle3 import Eagle3Trainer, TrainConfig, layer_ids
    from spec_backend_train.vocab import draft_vocabulary

    check_target(config.target, config.draft_vocab_size)  # before any work: the config alone
    _prepare_work(config)
    tokenizer: Any = load_tokenizer(resolve_model(config.target))
    if tokenizer is None:
        raise ValueError(f"train-eagle3 needs a target with a tokenizer, {config.target!r} has none")
    packages = config.packages or corpus.DEFAULT_PACKAGES
    train, _ = corpus.split_corpus(tokenizer, config.num_sequences, 0, config.max_len, packages)
    train += _respond_all(config, log)  # after the corpus: extractions already made stay valid
    layers, vocab = target_sizes(config.target)
    aux, state_ids = layer_ids(layers)
    files = _extract_all(config, train, list(state_ids), log)
    counts = torch.zeros(vocab, dtype=torch.int64)  # [V] token frequencies of the training text
    for path in files:
        counts += torch.bincount(load(path)[0], minlength=vocab)[:vocab]
    d2t, t2d = draft_vocabulary(counts, config.draft_vocab_size)
    steps = config.epochs * len(files)  # one optimiser step per file (sequences are cut to max_len)
    settings = TrainConfig(
        aux,
        d2t,
        t2d,
        config.ttt_steps,
        config.lr,
        config.seed,
        state_ids,
        steps,
        init_from_target=config.init_from_target,
        bf16=config.bf16,
        init_head=config.init_head,
    )
    trainer = Eagle3Trainer(config.target, settings)
    state_path = os.path.join(config.work_dir, f"trainer-{_training_key(config)}.pt")
    for epoch in range(trainer.restore(state_path), config.epochs):
        progress = _progress(log, epoch, len(files))
        losses = trainer.train(files, max_len=config.max_len, progress=progress, shuffle=config.seed + epoch)
        trainer.checkpoint(state_path, epoch + 1)
        log(f"epoch {epoch + 1}/{config.epochs}: mean loss {sum(losses) / max(1, len(losses)):.4f}")
    return trainer.save(config.out_dir, dtype=torch.bfloat16)


DATA_FIELDS = ("target", "num_sequences", "max_len", "seed", "packages", "chats", "chat_tokens", "prompts")
TRAINING_FIELDS = (
    "draft_vocab_size",
    "ttt_steps",
    "epochs",
    "lr",
    "seed",
    "bf16",
    "init_from_target",
    "init_head",
)


def _prepare_work(config: PipelineConfig) -> None:
    """Create the work folder, or check that the data it holds was made with this run's data settings
    (a resumed run reuses extracted sequences by their order, so other settings would mislabel them)."""
    from spec_backend_train.prompts import instruction_prompts

    os.makedirs(config.work_dir, exist_ok=True)
    path, now = os.path.join(config.work_dir, "config.json"), json.loads(json.dumps(asdict(config)))
    asked = "\n".join(instruction_prompts())  # another prompt set (a new release) asks other prompts
    now["prompts"] = hashlib.sha256(asked.encode()).hexdigest()[:16]
    if os.path.exists(os.path.join(config.work_dir, "extracted.json")) and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            before = json.load(f)
        changed = [f"{k}={before.get(k)!r} (now {now[k]!r})" for k in DATA_FIELDS if before.get(k) != now[k]]
        if changed:
            raise ValueError(
                f"--work {config.work_dir} holds data made with {', '.join(changed)}; "
                "pass the same settings to resume, or a new --work folder"
            )
    with open(path, "w", encoding="utf-8") as f:
        json.dump(now, f, indent=2)


def _training_key(config: PipelineConfig) -> str:
    """A short hash of the training settings: a checkpoint resumes only a run with the same ones."""
    settings = json.dumps([getattr(config, k) for k in TRAINING_FIELDS])
    return hashlib.sha256(settings.encode()).hexdigest()[:12]


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
    p.add_argument(
        "--work", help="working folder (extracted states, checkpoints; resumable); not with --online"
    )
    p.add_argument("--sequences", type=int, default=0, help="chats cut from installed packages' sources")
    p.add_argument("--max-len", type=int, default=512, help="tokens per sequence")
    p.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary size")
    p.add_argument("--ttt", type=int, default=3, help="training-time-test steps (drafts trained ahead)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1.5e-3, help="peak learning rate (cosine decay to a tenth)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--chats",
        type=int,
        default=6000,
        help="instruction prompts the target answers (--online: of the variants; 0: all)",
    )
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mixed-precision training (bfloat16 matmuls, float32 weights; fast where the CPU has bf16)",
    )
    p.add_argument(
        "--init-from-target",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the head as the target layer that reads the last auxiliary feature",
    )
    p.add_argument("--chat-tokens", type=int, default=160, help="longest answer to one instruction prompt")
    p.add_argument(
        "--init-head",
        default=None,
        help="continue from a head this command wrote (its --out folder; same --draft-vocab and data): "
        "--epochs more epochs with a fresh schedule from --lr",
    )
    _add_online_arguments(p)
    p.set_defaults(func=functools.partial(_cmd, p))


def _add_online_arguments(p: argparse.ArgumentParser) -> None:
    online = p.add_argument_group(
        "online (spec_backend_train.online: answers and states in the training process, batched)"
    )
    online.add_argument("--online", action="store_true", help="no work folder: for a GPU (--device cuda)")
    online.add_argument("--device", default="cpu", help="where the target and the head run")
    online.add_argument("--variants", type=int, default=4, help="dressings of each instruction prompt")
    online.add_argument("--samples", type=int, default=1, help="sampled answers per prompt besides greedy")
    online.add_argument("--batch", type=int, default=64, help="sequences per optimiser step")
    online.add_argument("--gen-batch", type=int, default=1024, help="prompts answered at once")
    online.add_argument("--answers", default=None, help="also keep the answers trained on in this file")
    online.add_argument("--budget", type=float, default=0.0, help="wall-clock seconds for the run (0: none)")
    online.add_argument(
        "--answer-share", type=float, default=0.4, help="of the budget, for answering at most"
    )
    online.add_argument(
        "--qat-int4",
        action="store_true",
        help="train through the int4 drafter's rounding (spec_backend_train.quant)",
    )
    online.add_argument(
        "--families",
        default=",".join(CORE),
        help="prompt families asked (spec_backend_train.prompts.FAMILIES)",
    )
    online.add_argument(
        "--self-prompts", type=int, default=0, help="prompts the target writes itself, asked besides"
    )


def _cmd_online(args: argparse.Namespace) -> int:
    from spec_backend_train.online import OnlineConfig
    from spec_backend_train.online import run as run_online

    config = OnlineConfig(
        args.target, args.out, args.device, prompts=args.chats, variants=args.variants, samples=args.samples,
        answer_tokens=args.chat_tokens, batch=args.batch, epochs=args.epochs, lr=args.lr,
        draft_vocab_size=args.draft_vocab, ttt_steps=args.ttt, seed=args.seed, budget_s=args.budget,
        max_len=args.max_len, gen_batch=args.gen_batch, answers_path=args.answers,
        answer_share=args.answer_share, qat_int4=args.qat_int4, self_prompts=args.self_prompts,
        families=families_of(args.families),
    )  # fmt: skip
    print(f"wrote {run_online(config)}")
    return 0


def _cmd(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Refuse bad arguments in one line (exit status 2) before any work, then run the chosen pipeline."""
    from spec_backend.tools.errors import fail

    try:
        check_arguments(parser, args)
    except ValueError as exc:
        return fail(exc)
    if args.online:
        return _cmd_online(args)
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
        chats=args.chats,
        chat_tokens=args.chat_tokens,
        bf16=args.bf16,
        init_from_target=args.init_from_target,
        init_head=args.init_head,
    )
    print(f"wrote {run(config)}")
    return 0


__all__ = ["PipelineConfig", "add_parser", "run"]
