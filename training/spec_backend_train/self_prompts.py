"""Prompts the target writes itself: the chat template's opening up to where a user's message begins,
sampled until the model ends the turn (the Magpie method: an instruction-tuned model, given only the
start of a user turn, writes the kind of request it was tuned on).

The handwritten families of ``spec_backend_train.prompts`` cover a few hundred subjects; a head trained on
their answers drafts held-out subjects *of those families* well and everyday chat less well. Self-written
prompts come from the target's own instruction-tuning distribution, with as many subjects as it knows.

Glossary:
    user-turn opening: the chat template rendered for one user message, cut where the message's text
        would start (for SmolLM2: the system turn, then ``<|im_start|>user\\n``).
    kept: a sampled request that ended with the end token within ``max_tokens``, has at least
        ``MIN_WORDS`` words, is new, and names none of ``prompts.BENCHMARK_CHAT_SUBJECTS`` (the benchmark's
        chat prompts must stay unseen); everything else is dropped and counted.
"""

from __future__ import annotations

from typing import Any

import torch

MIN_WORDS = 4
_MARK = "\x00user-text\x00"


def end_token(model: Any) -> int | None:
    """The target's end token (its generation config may name one, several or none: the first, or None)."""
    eos = model.generation_config.eos_token_id  # int, list or None
    return int(eos[0]) if isinstance(eos, list) else eos


def user_turn_opening(tokenizer: Any) -> list[int]:
    """The token ids of the user-turn opening (glossary); refused for a tokenizer without a chat template,
    where no turn exists to open."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("self-written prompts need a tokenizer with a chat template; this one has none")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    ids: list[int] = tokenizer(text[: text.index(_MARK)], add_special_tokens=True)["input_ids"]
    return [int(t) for t in ids]


def keep(text: str, seen: set[str], min_words: int = MIN_WORDS) -> bool:
    """Whether one decoded request is kept (glossary)."""
    from spec_backend_train.prompts import BENCHMARK_CHAT_SUBJECTS

    lowered = text.lower()
    return (
        len(text.split()) >= min_words
        and text not in seen
        and not any(subject in lowered for subject in BENCHMARK_CHAT_SUBJECTS)
    )


@torch.no_grad()
def self_prompts(
    model: Any,
    tokenizer: Any,
    count: int,
    *,
    seed: int = 0,
    temperature: float = 1.0,
    max_tokens: int = 64,
    batch: int = 64,
    min_words: int = MIN_WORDS,
) -> tuple[list[str], int]:
    """Up to ``count`` kept requests (glossary), sampled ``batch`` at a time from the user-turn opening
    with ``seed``, ``seed + 1``, ...; stops after ``4 * count`` samples. Returns the requests and how many
    samples were dropped."""
    if count < 1 or batch < 1 or max_tokens < 1 or not temperature > 0:
        raise ValueError(
            f"count, batch and max_tokens must be at least 1 and temperature above 0, got count={count},"
            f" batch={batch}, max_tokens={max_tokens}, temperature={temperature}"
        )
    eos = end_token(model)
    eos = tokenizer.eos_token_id if eos is None else eos
    if eos is None:
        raise ValueError("self-written prompts need an end token: the target's generation_config and its"
                         " tokenizer name none")  # fmt: skip
    opening = torch.tensor([user_turn_opening(tokenizer)], device=next(model.parameters()).device)  # [1, P]
    kept: list[str] = []
    seen: set[str] = set()
    drawn = 0
    while len(kept) < count and drawn < 4 * count:
        torch.manual_seed(seed + drawn // batch)
        rows = opening.expand(batch, -1)  # [B, P]
        out = model.generate(
            input_ids=rows, attention_mask=torch.ones_like(rows), max_new_tokens=max_tokens,
            do_sample=True, temperature=temperature, top_k=0, top_p=1.0, eos_token_id=eos, pad_token_id=eos,
        )[:, opening.shape[1] :].tolist()  # fmt: skip
        drawn += batch
        for row in out:
            text = (
                tokenizer.decode(row[: row.index(eos)], skip_special_tokens=True).strip()
                if eos in row
                else ""
            )
            if text and keep(text, seen, min_words) and len(kept) < count:
                kept.append(text)
                seen.add(text)
    return kept, drawn - len(kept)


__all__ = ["MIN_WORDS", "keep", "self_prompts", "user_turn_opening"]
