"""``spec-backend train-eagle3 --online``: the target answers prompts, and its hidden states train the
head in the same process, many sequences per step — the pipeline for a GPU.

The file pipeline (``pipeline``) answers prompts through the engine, writes each sequence's states to
disk and trains on one sequence per step: right for a 2-core CPU, where the target is the slow part. On a
GPU the target answers thousands of prompts at once (transformers' ``generate``) and recomputing the
states of each training batch is cheaper than storing them, so nothing is written but the head. The
head, its loss (TTT with the target's own distribution as teacher) and the output format are the file
pipeline's (``Eagle3Trainer``).

Glossary:
    variant: one dressing of an instruction prompt (``prompts.prompt_variants``): more distinct prompts
        than the 7,630 of the file pipeline, each answered greedily and ``samples`` times at 0.8.
    self-written prompt: a request the target writes from the opening of a user turn
        (``spec_backend_train.self_prompts``), asked besides the families' prompts (``self_prompts``).
    answer: a chat-formatted prompt's token ids followed by the target's response up to its end token.
    budget: wall-clock seconds for the whole run (a lent GPU is lent for minutes). Answering stops at
        ``answer_share`` of it; training plans its steps from its measured speed so that the cosine
        schedule ends in time. With a budget the amount of data and steps depends on the machine's
        speed; without one the run is the same for a seed on one machine.
    chain acceptance: on held-out greedy answers, 1 + how many of the head's K chained drafts equal the
        answer's next tokens (what greedy verification accepts per step), averaged over answer rows;
        scored before and after training, and after with the int4 drafter's weights
        (``spec_backend_train.quant``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from spec_backend_train.prompts import CORE, FAMILIES
from spec_backend_train.self_prompts import end_token


@dataclass(frozen=True)
class OnlineConfig:
    """The run's settings (``spec-backend train-eagle3 --help`` describes each)."""

    target: str
    out_dir: str
    device: str = "cpu"
    dtype: str = "bfloat16"  # the target's weights on the device
    prompts: int = 0  # instruction prompts answered (0: every variant)
    variants: int = 4
    samples: int = 1  # sampled answers per prompt besides the greedy one
    answer_tokens: int = 160
    gen_batch: int = 1024
    batch: int = 64  # sequences per optimiser step
    epochs: int = 3
    lr: float = 2e-3
    draft_vocab_size: int = 8192
    ttt_steps: int = 3
    seed: int = 0
    budget_s: float = 0.0  # 0: no limit
    answer_share: float = 0.4
    eval_prompts: int = 256
    max_len: int = 512
    answers_path: str | None = None  # where to keep the answers trained on (safetensors), if anywhere
    qat_int4: bool = False  # quantization-aware training for the int4 drafter (``spec_backend_train.quant``)
    families: tuple[str, ...] = CORE  # prompt families asked (``prompts.FAMILIES``)
    self_prompts: int = 0  # prompts the target writes itself, asked besides the families' (``self_prompts``)

    def __post_init__(self) -> None:
        counts = {"variants": self.variants, "answer_tokens": self.answer_tokens, "gen_batch": self.gen_batch,
                  "batch": self.batch, "epochs": self.epochs, "draft_vocab_size": self.draft_vocab_size,
                  "ttt_steps": self.ttt_steps, "max_len": self.max_len}  # fmt: skip
        low = [f"{k} must be at least 1, got {v}" for k, v in counts.items() if v < 1]
        low += [f"{k} must be at least 0, got {v}" for k, v in
                (("prompts", self.prompts), ("samples", self.samples), ("eval_prompts", self.eval_prompts),
                 ("budget_s", self.budget_s)) if v < 0]  # fmt: skip
        if not 0 < self.answer_share <= 1:
            low.append(f"answer_share must be in (0, 1], got {self.answer_share}")
        if self.self_prompts < 0:
            low.append(f"self_prompts must be at least 0, got {self.self_prompts}")
        if not self.families or set(self.families) - set(FAMILIES):
            low.append(f"families must name some of {sorted(FAMILIES)}, got {list(self.families)}")
        if low:
            raise ValueError("; ".join(low))


def encode_chats(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Each prompt as one user turn through the chat template (unchanged without one), tokenized as the
    engine does (``LLM.chat_prompt``)."""
    chat = bool(getattr(tokenizer, "chat_template", None))
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        if chat
        else p
        for p in prompts
    ]
    return [[int(t) for t in tokenizer(text, add_special_tokens=True)["input_ids"]] for text in texts]


@torch.no_grad()
def answer(
    model: Any, prompts: Sequence[list[int]], max_tokens: int, temperature: float, seed: int, eos: int | None
) -> list[list[int]]:
    """The target's responses to token-id ``prompts`` in one batch (left-padded), greedy when
    ``temperature`` is 0, else sampled from its whole distribution at ``temperature`` (no top-k/top-p);
    each result is the prompt followed by the response, cut after the first ``eos`` (if any)."""
    device = next(model.parameters()).device
    width, pad = max(len(p) for p in prompts), 0 if eos is None else eos
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)  # [B, P]
    mask = torch.zeros(len(prompts), width, dtype=torch.long)  # [B, P]
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    torch.manual_seed(seed)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=max_tokens,
        pad_token_id=pad,
        eos_token_id=eos,
        **(sampling if temperature > 0 else {"do_sample": False}),
    ).cpu()  # [B, P + new]
    results = []
    for i, p in enumerate(prompts):
        new = out[i, width:].tolist()
        results.append(list(p) + (new[: new.index(eos) + 1] if eos in new else new))  # eos None: never in
    return results


def answer_jobs(prompts: Sequence[list[int]], samples: int, batch: int) -> list[tuple[list[int], float]]:
    """Batches of (prompt index, temperature): greedy and sampled batches alternate, so a run cut short
    by its budget still has both kinds."""
    greedy = [list(range(s, min(s + batch, len(prompts)))) for s in range(0, len(prompts), batch)]
    sampled = [chunk for _ in range(samples) for chunk in greedy]
    jobs: list[tuple[list[int], float]] = []
    for i in range(max(len(greedy), len(sampled))):
        jobs += [(greedy[i], 0.0)] if i < len(greedy) else []
        jobs += [(sampled[i], 0.8)] if i < len(sampled) else []
    return jobs


def padded(seqs: Sequence[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``tokens [B, T]`` and ``lengths [B]``."""
    lengths = torch.tensor([len(s) for s in seqs])  # [B]
    tokens = torch.full((len(seqs), int(lengths.max())), pad, dtype=torch.long)  # [B, T]
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
    return tokens, lengths


@torch.no_grad()
def batch_states(target: Any, capture: Any, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The captured layers' states ``[B, T, n, H]`` of right-padded ``tokens [B, T]``."""
    from spec_backend.runtime.hidden import decoder_of

    mask = (torch.arange(tokens.shape[1], device=tokens.device)[None] < lengths[:, None]).long()  # [B, T]
    decoder_of(target)(input_ids=tokens, attention_mask=mask, use_cache=False)
    states: torch.Tensor = capture.padded()
    return states


@torch.no_grad()
def chain_acceptance(
    trainer: Any, capture: Any, seqs: Sequence[list[int]], starts: Sequence[int], batch: int
) -> list[float]:
    """Per-position chain acceptance rates of the head's drafts on answers (glossary): entry ``j`` is
    the share of answer rows whose first ``j + 1`` drafts all equal the answer's tokens."""
    steps, device = trainer.config.ttt_steps, trainer.device
    hits, rows = torch.zeros(steps, device=device), 0
    for first in range(0, len(seqs), batch):
        tokens, lengths = (t.to(device) for t in padded(seqs[first : first + batch], 0))
        begin = torch.tensor(starts[first : first + batch], device=device)  # [B]
        hidden = batch_states(trainer.target, capture, tokens, lengths)
        t = torch.arange(tokens.shape[1], device=device)[None]  # [1, T]
        valid = (t + 2 >= begin[:, None]) & (t + 1 + steps < lengths[:, None])  # [B, T] K answer tokens ahead
        chain = valid.clone()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=trainer.config.bf16):
            for j, logits in enumerate(trainer.unroll(tokens, hidden)):
                ahead = torch.full_like(tokens, -1)
                ahead[:, : tokens.shape[1] - 2 - j] = tokens[:, 2 + j :]  # [B, T] token t + 2 + j
                chain &= trainer.ids[logits.argmax(-1)] == ahead
                hits[j] += chain.sum()
        rows += int(valid.sum())
    return (hits / max(1, rows)).tolist()


def epochs_of(
    seqs: Sequence[list[int]], batch: int, epochs: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Right-padded batches, in a new order drawn from ``seed + epoch`` each epoch."""
    from spec_backend_train.eagle3 import epoch_order

    for epoch in range(epochs):
        order = epoch_order(len(seqs), seed, epoch)
        for first in range(0, len(order), batch):
            yield padded([seqs[i] for i in order[first : first + batch]], 0)


def fit_steps(done: int, seconds_left: float, pace: float, full: int) -> int:
    """How many optimiser steps the run can take in all: ``full``, or fewer when ``seconds_left`` at
    ``pace`` seconds per step do not reach it (never fewer than one more than ``done``)."""
    return max(done + 1, min(full, done + int(seconds_left / pace)))


def train_batches(
    trainer: Any, capture: Any, seqs: Sequence[list[int]], config: OnlineConfig, deadline: float,
    log: Callable[[str], None],
) -> list[float]:  # fmt: skip
    """The optimiser steps of the run: ``epochs`` passes, or as many steps as fit before ``deadline``:
    planned from the pace since the last plan at step 25, 125, 225, ... and whenever the plan is reached
    (the first steps are slow: warm-up), so the cosine schedule ends in time; returns the losses."""
    full = planned = config.epochs * math.ceil(len(seqs) / config.batch)
    trainer.reschedule(planned)
    losses: list[float] = []
    mark, clock = 0, time.monotonic()
    for tokens, lengths in epochs_of(seqs, config.batch, config.epochs, config.seed):
        tokens, lengths = tokens.to(trainer.device), lengths.to(trainer.device)
        hidden = batch_states(trainer.target, capture, tokens, lengths)
        losses.append(trainer.step(tokens, hidden, lengths))
        done, now = len(losses), time.monotonic()
        if done == 5:
            mark, clock = done, now
        if config.budget_s > 0 and done > mark and (done % 100 == 25 or done == planned):
            pace = (now - clock) / (done - mark)
            mark, clock = done, now
            fit = fit_steps(done, deadline - now, pace, full)
            if fit != planned:
                planned = fit
                trainer.reschedule(planned)
                log(f"budget: {planned} steps in all ({pace * 1000:.0f} ms each)")
        if done % 50 == 0 or done == planned:
            log(f"step {done}/{planned} loss {sum(losses[-50:]) / len(losses[-50:]):.4f}")
        if done >= planned or (config.budget_s > 0 and now > deadline):
            break
    return losses


def gather(
    model: Any,
    prompts: Sequence[list[int]],
    config: OnlineConfig,
    deadline: float,
    log: Callable[[str], None],
) -> list[list[int]]:
    """The target's answers to ``prompts`` (greedy, and ``samples`` sampled each), until the jobs are done
    or ``deadline`` passes."""
    eos = end_token(model)
    out: list[list[int]] = []
    for n, (chunk, temperature) in enumerate(answer_jobs(prompts, config.samples, config.gen_batch)):
        if config.budget_s > 0 and time.monotonic() > deadline:
            log(f"answering stopped by the budget after {len(out)} answers")
            break
        out += answer(
            model, [prompts[i] for i in chunk], config.answer_tokens, temperature, config.seed + n, eos
        )
        log(f"answered {len(out)} ({sum(map(len, out))} tokens)")
    return [s[: config.max_len] for s in out]


def interleaved(first: Sequence[str], second: Sequence[str]) -> list[str]:
    """Both lists merged in proportion, each in its order (``[a, a, b, a, a, b, ...]``), so a budget that
    stops answering early has answered both kinds."""
    keyed = [((i + 0.5) / len(first), 0, i) for i in range(len(first))]
    keyed += [((j + 0.5) / len(second), 1, j) for j in range(len(second))]
    return [(first, second)[which][k] for _, which, k in sorted(keyed)]


def asked_prompts(config: OnlineConfig, target: Any, tokenizer: Any, say: Callable[[str], None]) -> list[str]:
    """The families' variants (the first ``config.prompts``, or all) interleaved with the prompts the
    target writes itself (``config.self_prompts``)."""
    from spec_backend_train.prompts import prompt_variants
    from spec_backend_train.self_prompts import self_prompts

    asked = prompt_variants(config.variants, families=config.families)[: config.prompts or None]
    if not config.self_prompts:
        return asked
    written, dropped = self_prompts(
        target, tokenizer, config.self_prompts, seed=config.seed, batch=config.gen_batch
    )
    say(f"{len(written)} self-written prompts kept ({dropped} samples dropped), e.g. {written[:2]}")
    return interleaved(asked, written)


def save_answers(path: str, seqs: Sequence[list[int]]) -> None:
    """The answers as ``tokens int32 [sum of lengths]`` and ``lengths int32 [N]`` (safetensors)."""
    from safetensors.torch import save_file

    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)  # [total]
    save_file({"tokens": flat, "lengths": torch.tensor([len(s) for s in seqs], dtype=torch.int32)}, path)


def head_trainer(config: OnlineConfig, target: Any, seqs: Sequence[list[int]]) -> tuple[Any, Any]:
    """The trainer (draft vocabulary from the answers' token counts, init from the target layer) and the
    hooks that capture the target's states for it."""
    from spec_backend.runtime.hidden import HiddenCapture
    from spec_backend.step import HiddenStateRequest
    from spec_backend_train.eagle3 import Eagle3Trainer, TrainConfig, layer_ids
    from spec_backend_train.vocab import draft_vocabulary

    text = target.config.get_text_config()
    layers, vocab = int(text.num_hidden_layers), int(text.vocab_size)
    counts = torch.bincount(torch.tensor([t for s in seqs for t in s]), minlength=vocab)[:vocab]  # [V]
    d2t, t2d = draft_vocabulary(counts, min(config.draft_vocab_size, vocab))
    aux, state_ids = layer_ids(layers)
    settings = TrainConfig(aux, d2t, t2d, config.ttt_steps, config.lr, config.seed, state_ids, 0,
                           init_from_target=True, bf16=True, qat_int4=config.qat_int4)  # fmt: skip
    trainer = Eagle3Trainer(config.target, settings, target=target)
    return trainer, HiddenCapture(target, HiddenStateRequest(aux_layer_ids=state_ids), layers)


def run(config: OnlineConfig, log: Callable[[str], None] = print) -> str:
    """Answer, train, score and save (module docstring); returns the output folder."""
    from spec_backend.runtime.loader import load_model, load_tokenizer, resolve_dtype
    from spec_backend.runtime.sources import resolve_model
    from spec_backend_train.args_check import check_target
    from spec_backend_train.prompts import prompt_variants
    from spec_backend_train.quant import int4_linears, int4_weights

    start = time.monotonic()
    deadline = start + config.budget_s

    def say(message: str) -> None:
        log(f"[{time.monotonic() - start:6.1f}s] {message}")

    check_target(config.target, config.draft_vocab_size)  # before any work: the config alone
    torch.manual_seed(config.seed)
    source = resolve_model(config.target)
    tokenizer = load_tokenizer(source)
    if tokenizer is None:
        raise ValueError(f"train-eagle3 --online needs a target with a tokenizer, {config.target!r} has none")
    target = load_model(source, "sdpa", resolve_dtype(config.dtype), torch.device(config.device))
    prompts = encode_chats(tokenizer, asked_prompts(config, target, tokenizer, say))
    held_out = encode_chats(tokenizer, prompt_variants(1, held_out=True)[: config.eval_prompts])
    scored = gather(target, held_out, OnlineConfig(**{**asdict(config), "samples": 0}), math.inf, say)
    seqs = gather(target, prompts, config, start + config.answer_share * config.budget_s, say)
    seqs = [s for s in seqs if len(s) >= config.ttt_steps + 2]
    if config.answers_path:
        save_answers(config.answers_path, seqs)
    trainer, capture = head_trainer(config, target, seqs)
    starts = [len(p) for p in held_out]
    before = chain_acceptance(trainer, capture, scored, starts, config.batch)
    losses = train_batches(trainer, capture, seqs, config, deadline - 30, say)
    after = chain_acceptance(trainer, capture, scored, starts, config.batch)
    with int4_weights(int4_linears(trainer.head)):  # as `"quantization": "int4"` serves it
        after_int4 = chain_acceptance(trainer, capture, scored, starts, config.batch)
    report = {
        "config": asdict(config), "answers": len(seqs), "tokens": sum(map(len, seqs)), "steps": len(losses),
        "loss_first_50": sum(losses[:50]) / max(1, len(losses[:50])),
        "loss_last_50": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "held_out_chain_before": before, "held_out_chain_after": after, "held_out_chain_int4": after_int4,
        "seconds": time.monotonic() - start,
    }  # fmt: skip
    say(
        f"held-out chain acceptance length {1 + sum(before):.3f} (untrained) -> {1 + sum(after):.3f}"
        f" ({1 + sum(after_int4):.3f} with int4 weights)"
    )
    out = str(trainer.save(config.out_dir, dtype=torch.bfloat16))
    with open(os.path.join(out, "training.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    return out


__all__ = ["OnlineConfig", "answer", "chain_acceptance", "encode_chats", "head_trainer", "run"]
