"""A small lm-evaluation-harness task set built offline: local JSON-lines files read by lm-eval's own
custom-task configuration (``dataset_path: json`` with ``data_files``), one task per request type.

* ``sb_choice`` (multiple_choice, ``acc`` / ``acc_norm``): log-likelihoods of multi-character choices;
* ``sb_greedy`` (loglikelihood, ``acc`` = is-greedy): half of its targets are the model's own greedy
  continuation (found with transformers here), so ``acc`` is 1/2 and the is-greedy flag is exercised
  both ways;
* ``sb_rolling`` (loglikelihood_rolling, perplexities): whole texts scored from the first token;
* ``sb_generate`` (generate_until, ``exact_match``): greedy generation stopped at a newline; half of
  its answers are the model's greedy text, so ``exact_match`` is 1/2 where generation is right.

The configurations are the dictionaries a task YAML file holds; ``simple_evaluate`` takes them as they
are, so no task registry or hub access is involved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHOICE_DOCS = [
    {"question": f"Question {i}: which word follows '{word}'?", "choices": choices, "label": i % 4}
    for i, (word, choices) in enumerate(
        [
            ("red", ["apple", "banana", "cherry", "date"]),
            ("one", ["two", "three", "four", "five"]),
            ("cat", ["dog", "mouse", "bird", "fish"]),
            ("north", ["south", "east", "west", "up"]),
            ("abc", ["abc", "def", "ghi", "jkl"]),
            ("hello", ["world", "there", "again", "friend"]),
            ("x", ["y", "zz", "www", "vvvv"]),
            ("sun", ["moon", "star", "sky", "cloud"]),
        ]
    )
]
ROLLING_DOCS = [
    {"text": "The quick brown fox jumps over the lazy dog."},
    {"text": "abc abc abc abc, then xyz."},
    {"text": "Speculative decoding verifies several drafted tokens in one target step."},
]
GENERATE_PROMPTS = ["Say abc:", "Count: 1 2 3", "hello world", "Q: what is 2+2?\nA:", "xyz xyz", "The end"]
GREEDY_PROMPTS = ["abcabc", "hello ", "The cat", "1 2 3 ", "Once upon", "zzz"]
#: Most tokens lm-eval generates per ``sb_generate`` answer.
MAX_GEN_TOKS = 16


def _write(directory: Path, name: str, docs: list[dict[str, Any]]) -> dict[str, Any]:
    path = directory / f"{name}.jsonl"
    path.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    return {
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(path)}},
        "test_split": "test",
    }


class Greedy:
    """The tiny model's greedy continuations, from transformers' ``generate`` (what the tasks' targets
    are made of)."""

    def __init__(self, model_dir: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def ids(self, prompt: str, count: int) -> list[int]:
        import torch

        ids = torch.tensor([self.tokenizer(prompt, add_special_tokens=False).input_ids])  # [1, P]
        with torch.no_grad():
            out = self.model.generate(
                ids, max_new_tokens=count, do_sample=False, pad_token_id=0
            )  # [1, P+count]
        return [int(t) for t in out[0, ids.shape[1] :]]

    def text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))


def greedy_docs(greedy: Greedy) -> list[dict[str, str]]:
    """One doc per prompt: even ones target the model's greedy continuation (up to 4 tokens, cut before
    an ``<unk>`` or ``<eos>``, which do not re-tokenize to themselves), odd ones the same with its first
    character changed."""
    spelled = range(2, len(greedy.tokenizer))
    docs = []
    for i, prompt in enumerate(GREEDY_PROMPTS):
        new = greedy.ids(prompt, 4)
        text = greedy.text(new[: next((j for j, t in enumerate(new) if t not in spelled), len(new))])
        if not text:  # the tiny model is seeded: a prompt that fails here fails every run
            raise ValueError(f"the greedy continuation of {prompt!r} starts with an unspellable id: {new}")
        target = text if i % 2 == 0 else ("a" if text[0] != "a" else "b") + text[1:]
        docs.append({"prompt": prompt, "target": target})
    return docs


def generate_docs(greedy: Greedy) -> list[dict[str, str]]:
    """One doc per prompt: even ones answer what greedy generation gives (``MAX_GEN_TOKS`` tokens, cut
    at the first newline as lm-eval cuts at ``until``), odd ones something else."""
    docs = []
    for i, prompt in enumerate(GENERATE_PROMPTS):
        text = greedy.text(greedy.ids(prompt, MAX_GEN_TOKS)).split("\n")[0]
        docs.append({"prompt": prompt, "answer": text if i % 2 == 0 else f"not {text}"})
    return docs


def task_set(directory: Path, greedy: Greedy) -> list[dict[str, Any]]:
    """The four task configurations, their data written under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    return [
        {
            "task": "sb_choice",
            **_write(directory, "choice", CHOICE_DOCS),
            "output_type": "multiple_choice",
            "doc_to_text": "{{question}}",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{label}}",
            "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
        },
        {
            "task": "sb_greedy",
            **_write(directory, "greedy", greedy_docs(greedy)),
            "output_type": "loglikelihood",
            "doc_to_text": "{{prompt}}",
            "doc_to_target": "{{target}}",
            "target_delimiter": "",
            "metric_list": [{"metric": "acc"}, {"metric": "perplexity"}],
        },
        {
            "task": "sb_rolling",
            **_write(directory, "rolling", ROLLING_DOCS),
            "output_type": "loglikelihood_rolling",
            "doc_to_text": "",
            "doc_to_target": "{{text}}",
            "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")],
        },
        generate_task(directory, greedy),
    ]


def generate_task(directory: Path, greedy: Greedy) -> dict[str, Any]:
    """``sb_generate`` alone (what the chat model runs)."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "task": "sb_generate",
        **_write(directory, "generate", generate_docs(greedy)),
        "output_type": "generate_until",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": MAX_GEN_TOKS, "do_sample": False},
        "metric_list": [{"metric": "exact_match"}],
    }
