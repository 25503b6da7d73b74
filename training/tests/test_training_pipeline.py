"""``spec-backend train-eagle3``'s stages on a tiny target: the offline corpus and a resumable run."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend_train import corpus, prompts
from spec_backend_train.data import respond
from spec_backend_train.pipeline import PipelineConfig, run

from spec_backend.engine import LLM, SamplingParams
from spec_backend.tools.tiny import make_tiny_model


def test_corpus_is_stable_and_split_by_file() -> None:
    docs = list(corpus.documents(("json",)))
    assert docs and [d.name for d in docs] == sorted(d.name for d in docs)
    assert all(d.name.startswith("json/") for d in docs)
    assert [d.name for d in corpus.documents(("json", "no_such_package_x"))] == [d.name for d in docs]
    chats = list(corpus.conversations(docs[0], chunk_chars=400))
    assert chats and chats[0][0]["role"] == "user" and docs[0].name in chats[0][0]["content"]
    held = {d.name for d in docs if d.held_out}
    assert held == {d.name for d in corpus.documents(("json",)) if d.held_out}  # same split every time


def test_chats_use_the_tokenizers_chat_template(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from spec_backend.tools.tiny import make_tiny_tokenizer

    make_tiny_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    chat = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}]
    plain = corpus.encode(tokenizer, chat, 100)
    assert plain == tokenizer.encode("ab\ncd")
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'][0] }}>{{ m['content'] }}{% endfor %}"
    ids = corpus.encode(tokenizer, chat, 100)
    assert tokenizer.decode(ids) == "<u>ab<a>cd" and corpus.encode(tokenizer, chat, 4) == ids[:4]


def test_pipeline_trains_a_servable_head_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = make_tiny_model(tmp_path / "target", "llama", num_hidden_layers=6, with_tokenizer=True)
    config = PipelineConfig(
        target,
        str(tmp_path / "out"),
        str(tmp_path / "work"),
        num_sequences=10,
        max_len=96,
        draft_vocab_size=64,
        ttt_steps=2,
        epochs=2,
        packages=("json",),
        chats=6,
        chat_tokens=8,
    )
    logs: list[str] = []
    out = run(config, logs.append)
    assert any("answered 6/6" in line for line in logs) and any("extracted 16/16" in line for line in logs)
    assert any("epoch 2/2" in line for line in logs)
    digest = hashlib.sha256(Path(out, "model.safetensors").read_bytes()).hexdigest()
    again: list[str] = []
    run(config, again.append)  # resumes: nothing to extract, no epoch left
    assert not any(word in line for line in again for word in ("answered", "extracted", "epoch"))
    assert hashlib.sha256(Path(out, "model.safetensors").read_bytes()).hexdigest() == digest
    available = len(prompts.instruction_prompts())
    with pytest.raises(ValueError, match=rf"--chats must be in \[0, {available}\] .*got 50000"):
        run(dataclasses.replace(config, work_dir=str(tmp_path / "other"), chats=50000))
    with pytest.raises(ValueError, match=r"chats=6 \(now 7\); pass the same settings"):
        run(dataclasses.replace(config, chats=7))  # the extracted data would be mislabelled
    with monkeypatch.context() as patch:  # as would answers to another prompt set
        patch.setitem(prompts.FAMILIES, "pair", (("Contrast {s}.",), ["tea and coffee"]))
        with pytest.raises(ValueError, match=r"holds data made with prompts='[0-9a-f]{16}' \(now '"):
            run(config)
    changed: list[str] = []  # new training settings: a new checkpoint, trained from the start
    run(dataclasses.replace(config, lr=1e-3, epochs=1), changed.append)
    assert any("epoch 1/1" in line for line in changed) and not any("extracted" in x for x in changed)

    llm = LLM(target, speculative_config={"model": out})
    spec = llm.speculative_config
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("eagle3", 2)
    params = SamplingParams(temperature=0.0, max_tokens=16)
    plain = LLM(target).generate(["import json"], params)[0].outputs[0].token_ids
    assert llm.generate(["import json"], params)[0].outputs[0].token_ids == plain
    assert llm.metrics.total.num_draft_tokens > 0


def test_instruction_prompts_split_by_subject_and_answers_follow_the_prompt(tmp_path: Path) -> None:
    every = list(prompts.FAMILIES)
    train, held = prompts.prompt_items(families=every), prompts.prompt_items(held_out=True, families=every)
    families = prompts.FAMILIES.values()
    assert len(train) + len(held) == sum(len(templates) * len(subjects) for templates, subjects in families)
    core = prompts.prompt_items()
    assert prompts.instruction_prompts() == [p for _, p in core] and len(set(train)) == len(train)  # stable
    assert {s for s, _ in train} and {s for s, _ in held} and not {s for s, _ in train} & {s for s, _ in held}
    assert all(subject in prompt for subject, prompt in train + held)
    first = [p for _, p in core[:48]]
    assert len({p.split()[0] for p in first}) > 8  # the first prompts already mix phrasings
    assert sum(p.endswith(c) for p in first for c in prompts.CLOSINGS if c) > 8  # and closings
    subjects = [s.lower() for _, (_, listed) in prompts.FAMILIES.items() for s in listed]
    assert not [(s, c) for s in subjects for c in prompts.BENCHMARK_CHAT_SUBJECTS if c in s]

    target = make_tiny_model(tmp_path / "target", "llama", with_tokenizer=True)
    llm = LLM(target)
    asked = ["Explain tea to a beginner.", "Write a haiku about rain."]
    answers = respond(llm, asked, max_tokens=6, seed=0)
    greedy = llm.generate([llm.chat_prompt(asked[0])], SamplingParams(temperature=0.0, max_tokens=6))[0]
    assert answers[0] == greedy.prompt_token_ids + greedy.outputs[0].token_ids  # even: greedy
    sampled = SamplingParams(temperature=0.8, max_tokens=6, seed=1)  # odd: temperature 0.8, seed + index
    again = llm.generate([llm.chat_prompt(asked[1])], sampled)[0]
    assert answers[1] == again.prompt_token_ids + again.outputs[0].token_ids


def test_cli_help_lists_train_eagle3(capsys: pytest.CaptureFixture[str]) -> None:
    from spec_backend.cli import main

    with pytest.raises(SystemExit):
        main(["train-eagle3", "--help"])
    assert "--draft-vocab" in capsys.readouterr().out
