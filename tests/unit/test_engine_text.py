"""Text prompts with a (character-level) tokenizer: stop strings, detokenization and the CLI."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import fixed_ngram

from spec_backend.engine import LLM, SamplingParams
from spec_backend.tools.tiny import make_tiny_model

NGRAM = fixed_ngram(3, 3)
PROMPT = "def add(a, b):\n    return a + b\ndef add(a, b):\n"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield make_tiny_model(tmp_path_factory.mktemp("tiny-text"), "llama", with_tokenizer=True, eos_token_id=1)
    torch.set_num_threads(threads)


def test_text_prompt_and_stop_string(model_dir: str) -> None:
    llm = LLM(model_dir, speculative_config=NGRAM)
    full = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))[0]
    c = full.outputs[0]
    assert full.prompt == PROMPT and len(full.prompt_token_ids) == len(PROMPT)
    assert len(c.token_ids) == 30 and c.text == llm.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    stop = c.text[5:7]
    cut = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=30, stop=stop, ignore_eos=True))[0]
    assert cut.outputs[0].finish_reason == "stop" and cut.outputs[0].stop_reason == stop
    assert cut.outputs[0].text == c.text[: c.text.index(stop)]
    assert cut.outputs[0].token_ids == c.token_ids[: len(cut.outputs[0].token_ids)]


def test_cli_generate_and_parsers(model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    from spec_backend.cli import build_parser, main

    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"generate", "bench", "demo"} <= set(commands)
    code = main(
        [
            "generate",
            "--model",
            model_dir,
            "--prompt",
            PROMPT,
            "--prompt",
            "x = 1",
            "--max-tokens",
            "6",
            "--no-chat",
            "--no-progress",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}',
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "=== prompt: 'x = 1'" in out and "tokens/s" in out and "mean acceptance length" in out
    assert main(["generate", "--model", model_dir, "--prompt", "x", "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err


def test_cli_seed_makes_sampled_runs_reproducible(model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    from spec_backend.cli import main

    def completions(seed: str) -> list[str]:
        argv = ["generate", "--model", model_dir, "--prompt", "ab", "--prompt", "ab", "--max-tokens", "12"]
        argv += ["--temperature", "1.0", "--no-chat", "--no-progress", "--seed", seed]
        assert main(argv) == 0
        blocks = capsys.readouterr().out.split("=== prompt: ")[1:]  # each: prompt, text, "--- finish..."
        return [block.split("\n--- finish_reason")[0] for block in blocks]

    first = completions("3")
    assert completions("3") == first  # the same engine seed: the same samples
    assert first[0] != first[1]  # two identical prompts still draw different numbers
    assert completions("4") != first  # negative control: another seed samples differently


def test_demo_compares_methods_with_plain_decoding(
    model_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from spec_backend.cli import main

    code = main(["demo", "--model", model_dir, "--num-prompts", "1", "--max-tokens", "8"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out[out.index("same text as plain") :].splitlines()[1:]
    table, verdicts = lines[:3], lines[3:]
    assert [line.split()[0] for line in table] == ["plain", "ngram", "suffix"]
    assert all(line.split()[-1] == "yes" for line in table)
    # per drafter and kind of prompt, a plain statement of whether speculation paid there
    said = [v.split(":")[0] for v in verdicts]
    assert said == [f"{m} on {k}" for m in ("ngram", "suffix") for k in ("code edit", "open chat")]
    assert all(
        re.search(r"speculation (pays|does not pay) here \(\d+\.\d\dx plain decoding\)", v) for v in verdicts
    )


def test_cli_generate_sampling_flags_and_json(model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--top-p/--top-k/--stop reach SamplingParams, --json prints one parseable object whose texts
    equal offline generate with the same settings, and bad values fail with the parameter's message."""
    import json

    from spec_backend.cli import main

    base = ["generate", "--model", model_dir, "--prompt", PROMPT, "--prompt", "x = 1", "--no-chat"]
    assert main([*base, "--max-tokens", "12", "--json", "--stop", "e", "--top-k", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    llm = LLM(model_dir)
    params = SamplingParams(temperature=0, max_tokens=12, stop="e", top_k=5)
    expected = llm.generate([PROMPT, "x = 1"], params)
    assert [o["text"] for o in report["outputs"]] == [o.outputs[0].text for o in expected]
    assert [o["finish_reason"] for o in report["outputs"]] == [o.outputs[0].finish_reason for o in expected]
    assert report["summary"]["generated_tokens"] == sum(len(o["token_ids"]) for o in report["outputs"])
    assert report["summary"]["tokens_per_s"] > 0
    # the one-token warm-up on the first prompt stored its whole 16-token blocks; the second prompt is short
    first = len(llm.tokenizer(PROMPT)["input_ids"])
    assert first > 32  # character-level: two whole blocks at least
    assert [o["num_cached_tokens"] for o in report["outputs"]] == [min(first // 16 * 16, first - 1), 0]
    assert main([*base, "--top-p", "1.5", "--no-progress"]) == 2
    assert "top_p" in capsys.readouterr().err


def test_progress_bar_counts_tokens(model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    llm = LLM(model_dir)
    llm.generate(["ab", "cd"], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=True)
    err = capsys.readouterr().err
    assert "10/10" in err and "tok" in err and "req" not in err


def test_chat_applies_the_template_and_get_metrics_matches_the_outputs(tmp_path: Path) -> None:
    """vLLM's ``LLM.chat`` (one conversation or several) equals ``generate`` on the templated text;
    ``get_metrics`` reports the run's speculative counters under vLLM's names, equal to the outputs' sums."""
    model = make_tiny_model(tmp_path / "chat", vocab_size=128, with_tokenizer=True)
    (tmp_path / "chat" / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
    )
    llm = LLM(
        model,
        speculative_config={
            "adaptive_draft_length": False,
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 1,
        },
    )
    params = SamplingParams(temperature=0, max_tokens=10)
    conversation = [{"role": "user", "content": "abcabc"}]
    one = llm.chat(conversation, params)
    both = llm.chat(
        [conversation, [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]], params
    )
    plain = llm.generate(["<user>abcabc\n<assistant>", "<system>x\n<user>y\n<assistant>"], params)
    assert one[0].outputs[0].text == both[0].outputs[0].text == plain[0].outputs[0].text
    assert both[1].outputs[0].text == plain[1].outputs[0].text
    metrics = {m.name: m for m in llm.get_metrics()}
    outputs = [*one, *both, *plain]
    assert metrics["vllm:spec_decode_num_draft_tokens"].value == sum(
        o.spec_stats.num_draft_tokens for o in outputs
    )
    accepted = sum(o.spec_stats.num_accepted_tokens for o in outputs)
    assert metrics["vllm:spec_decode_num_accepted_tokens"].value == accepted > 0
    assert sum(metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values) == accepted
    with pytest.raises(ValueError, match="has no chat template"):
        LLM(make_tiny_model(tmp_path / "plain", vocab_size=128, with_tokenizer=True)).chat(conversation)
