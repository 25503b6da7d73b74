"""``spec_backend_train.self_prompts``: the target writes requests from the opening of a user turn."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend_train import self_prompts as sp
from spec_backend_train.prompts import BENCHMARK_CHAT_SUBJECTS

from spec_backend.runtime.loader import load_model, load_tokenizer
from spec_backend.runtime.sources import resolve_model
from spec_backend.tools.tiny import make_tiny_model

CHATML = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    folder = tmp_path_factory.mktemp("self") / "target"
    path = resolve_model(
        make_tiny_model(folder, "llama", seed=5, with_tokenizer=True, initializer_range=0.05)
    )
    tokenizer = load_tokenizer(path)
    tokenizer.chat_template = CHATML
    return load_model(path, "sdpa", torch.float32, torch.device("cpu")), tokenizer


def test_the_opening_is_the_template_up_to_the_users_text(target: tuple[Any, Any]) -> None:
    _, tokenizer = target
    opening = sp.user_turn_opening(tokenizer)
    assert tokenizer.decode(opening) == "<|user|>"
    whole = tokenizer.apply_chat_template([{"role": "user", "content": "hi there"}], tokenize=False)
    assert tokenizer(whole)["input_ids"][: len(opening)] == opening
    tokenizer.chat_template, template = None, tokenizer.chat_template
    try:
        with pytest.raises(ValueError, match="chat template"):
            sp.user_turn_opening(tokenizer)
    finally:
        tokenizer.chat_template = template


def test_keep_drops_short_repeated_and_benchmark_requests() -> None:
    assert sp.keep("How do I bake a cake?", set())
    assert not sp.keep("Bake a cake", set())  # three words
    assert not sp.keep("How do I bake a cake?", {"How do I bake a cake?"})
    assert BENCHMARK_CHAT_SUBJECTS  # every benchmark subject, in any case, is dropped
    for subject in BENCHMARK_CHAT_SUBJECTS:
        assert not sp.keep(f"Tell me all about {subject.upper()} today please", set())
    assert sp.keep("Tell me all about tea today please", set())  # the same request, another subject


def test_requests_are_sampled_turns_seeded_and_bounded(target: tuple[Any, Any]) -> None:
    model, tokenizer = target
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    kept, dropped = sp.self_prompts(model, tokenizer, 6, seed=3, max_tokens=24, batch=8, min_words=1)
    assert kept and len(kept) <= 6 and len(set(kept)) == len(kept)
    assert (kept, dropped) == sp.self_prompts(
        model, tokenizer, 6, seed=3, max_tokens=24, batch=8, min_words=1
    )
    assert kept != sp.self_prompts(model, tokenizer, 6, seed=4, max_tokens=24, batch=8, min_words=1)[0]
    # each request is a sampled turn that ended: regenerate the first batch and find them there
    opening = torch.tensor([sp.user_turn_opening(tokenizer)])  # [1, P]
    torch.manual_seed(3)
    rows = model.generate(input_ids=opening.expand(8, -1), attention_mask=torch.ones(8, opening.shape[1]),
                          max_new_tokens=24, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          eos_token_id=1, pad_token_id=1)[:, opening.shape[1] :].tolist()  # fmt: skip
    ended = [tokenizer.decode(r[: r.index(1)], skip_special_tokens=True).strip() for r in rows if 1 in r]
    assert kept[0] == next(text for text in ended if text)
    # negative control: with one new token no turn can say anything before it ends, so nothing is kept
    assert sp.self_prompts(model, tokenizer, 3, max_tokens=1, batch=4, min_words=1) == ([], 12)


def test_bad_settings_are_refused(target: tuple[Any, Any]) -> None:
    model, tokenizer = target
    with pytest.raises(ValueError, match="count=0"):
        sp.self_prompts(model, tokenizer, 0)
    with pytest.raises(ValueError, match="temperature=0"):
        sp.self_prompts(model, tokenizer, 2, temperature=0)


def test_prompt_families_are_named_and_the_core_is_the_default(tmp_path: Path) -> None:
    from spec_backend_train import prompts

    assert prompts.prompt_items() == prompts.prompt_items(families=prompts.CORE)
    added = prompts.prompt_variants(1, families=["why"])
    assert added and all(p not in prompts.instruction_prompts() for p in added)
    with pytest.raises(ValueError, match="unknown prompt families \\['chit'\\]"):
        prompts.prompt_items(families=["chit"])
