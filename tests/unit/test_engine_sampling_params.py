"""vLLM's ``SamplingParams`` in the engine: penalties, ``min_tokens``, ``logit_bias``,
``allowed_token_ids``, ``min_p``, ``logprobs``, ``prompt_logprobs`` and ``n``.

Oracles: a plain full-sequence decoding loop written here over the transformers model (no cache, no
engine) that applies vLLM's rules token by token; transformers' own repetition penalty; and
``log_softmax`` of a transformers forward over prompt + output. Speculation (a draft model that
proposes every step, accepted about half the time) must give the same tokens and log-probabilities.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from engine_fixtures import PROMPTS

from spec_backend.engine import LLM, SamplingParams
from spec_backend.engine.logits import RowHistory, process_logits
from spec_backend.tools.tiny import make_tiny_model

PENALTIES = dict(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("sp"), "llama", vocab_size=128, seed=0))


@pytest.fixture(scope="module")
def hf_model(target_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()


@pytest.fixture(scope="module")
def llm(target_dir: str) -> LLM:
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": target_dir,
        "num_speculative_tokens": 3,
    }
    return LLM(target_dir, dtype="float64", speculative_config=spec)


def _generate(llm: LLM, params: SamplingParams, speculate: bool, prompts: list[list[int]] = PROMPTS) -> Any:
    llm.set_speculation(speculate)
    try:
        return llm.generate(prompts, params)
    finally:
        llm.set_speculation(True)


@torch.inference_mode()
def _reference_greedy(model: Any, prompt: list[int], params: SamplingParams, stop_ids: set[int]) -> list[int]:
    """Greedy decoding with vLLM's processing rules, one full forward per token."""
    out: list[int] = []
    while len(out) < params.max_tokens:
        logits = model(torch.tensor([prompt + out])).logits[0, -1].clone()  # [V]
        if len(out) < params.min_tokens:
            logits[sorted(stop_ids)] = -math.inf
        for token, bias in (params.logit_bias or {}).items():
            logits[token] += bias
        for token in set(prompt + out):
            value = logits[token]
            logits[token] = (
                value / params.repetition_penalty if value > 0 else value * params.repetition_penalty
            )
        for token in set(out):
            logits[token] -= params.frequency_penalty * out.count(token) + params.presence_penalty
        out.append(int(logits.argmax()))
        if out[-1] in stop_ids:
            break
    return out


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=20, **PENALTIES),
        SamplingParams(temperature=0.0, max_tokens=20, repetition_penalty=0.7, frequency_penalty=-0.5),
        SamplingParams(
            temperature=0.0, max_tokens=20, min_tokens=8, stop_token_ids=[82, 3, 77, 112], **PENALTIES
        ),
        SamplingParams(temperature=0.0, max_tokens=12, logit_bias={3: 2.5, 95: -100}, presence_penalty=1.0),
    ],
    ids=["penalties", "negative", "min_tokens", "logit_bias"],
)
def test_processing_matches_reference_with_and_without_speculation(
    llm: LLM, hf_model: Any, params: SamplingParams
) -> None:
    expected = [_reference_greedy(hf_model, p, params, set(params.stop_token_ids or [])) for p in PROMPTS]
    plain = [o.outputs[0].token_ids for o in _generate(llm, params, False)]
    before = llm.metrics.total.num_accepted_tokens
    spec = [o.outputs[0].token_ids for o in _generate(llm, params, True)]
    assert plain == expected
    assert spec == expected
    assert llm.metrics.total.num_accepted_tokens > before  # drafts were accepted: multi-row histories


def test_repetition_penalty_matches_transformers(llm: LLM, hf_model: Any) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=16, repetition_penalty=1.5)
    for prompt, out in zip(PROMPTS, _generate(llm, params, True), strict=True):
        ids = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=16,
            do_sample=False,
            repetition_penalty=1.5,
            eos_token_id=None,
        )[0, len(prompt) :].tolist()
        assert out.outputs[0].token_ids == ids


def test_min_tokens_holds_back_stop_tokens(llm: LLM) -> None:
    free = _generate(llm, SamplingParams(temperature=0.0, max_tokens=12), True)[0].outputs[0].token_ids
    stop = free[2]
    early = _generate(llm, SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop]), True)
    assert early[0].outputs[0].token_ids == free[:3]  # negative control: the stop token ends it at 3
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop], min_tokens=6)
    for speculate in (False, True):
        tokens = _generate(llm, params, speculate)[0].outputs[0].token_ids
        assert len(tokens) >= 6 and stop not in tokens[:6]


def test_logprobs_equal_the_models_and_speculation_does_not_change_them(llm: LLM, hf_model: Any) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=3, prompt_logprobs=2, **PENALTIES)
    plain, spec = _generate(llm, params, False), _generate(llm, params, True)
    for prompt, a, b in zip(PROMPTS, plain, spec, strict=True):
        tokens = a.outputs[0].token_ids
        assert b.outputs[0].token_ids == tokens
        with torch.inference_mode():
            lp = torch.log_softmax(hf_model(torch.tensor([prompt + tokens])).logits[0], dim=-1)  # [L, V]
        rows = lp[len(prompt) - 1 : -1]  # row t predicts output token t
        for got in (a, b):
            entries = got.outputs[0].logprobs
            assert len(entries) == len(tokens)
            for row, token, entry in zip(rows, tokens, entries, strict=True):
                top = row.topk(3)
                assert next(iter(entry)) == token and set(top.indices.tolist()) <= set(entry)
                assert len(entry) == (3 if token in top.indices else 4)
                assert entry[token].rank == int((row > row[token]).sum()) + 1
                for t, value in entry.items():
                    assert value.logprob == pytest.approx(float(row[t]), abs=1e-9)
            assert got.outputs[0].cumulative_logprob == pytest.approx(
                sum(float(r[t]) for r, t in zip(rows, tokens, strict=True)), abs=1e-8
            )
            assert got.prompt_logprobs is not None and got.prompt_logprobs[0] is None
            assert len(got.prompt_logprobs) == len(prompt)
            for t in range(1, len(prompt)):
                entry = got.prompt_logprobs[t]
                assert entry is not None and next(iter(entry)) == prompt[t]
                assert entry[prompt[t]].logprob == pytest.approx(float(lp[t - 1, prompt[t]]), abs=1e-9)
                assert set(lp[t - 1].topk(2).indices.tolist()) <= set(entry)


def test_no_logprobs_unless_asked(llm: LLM) -> None:
    out = _generate(llm, SamplingParams(temperature=0.0, max_tokens=4), True)[0]
    assert out.outputs[0].logprobs is None and out.outputs[0].cumulative_logprob is None
    assert out.prompt_logprobs is None and out.num_cached_tokens == 0


def test_allowed_token_ids_and_min_p(llm: LLM) -> None:
    allowed = [3, 17, 40, 99]
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, seed=1, max_tokens=20, allowed_token_ids=allowed)
        for out in _generate(llm, params, True):
            assert set(out.outputs[0].token_ids) <= set(allowed)
    # min_p = 1 keeps only the most likely token: sampling at any temperature becomes greedy
    greedy = [
        o.outputs[0].token_ids for o in _generate(llm, SamplingParams(temperature=0.0, max_tokens=12), True)
    ]
    sharp = SamplingParams(temperature=1.5, seed=3, max_tokens=12, min_p=1.0)
    assert [o.outputs[0].token_ids for o in _generate(llm, sharp, True)] == greedy
    loose = SamplingParams(temperature=1.5, seed=3, max_tokens=12)  # negative control
    assert [o.outputs[0].token_ids for o in _generate(llm, loose, True)] != greedy


def test_n_samples_use_seed_plus_index(llm: LLM) -> None:
    out = llm.generate(PROMPTS[:2], SamplingParams(n=3, seed=11, max_tokens=6))
    assert len(out) == 2
    for prompt, result in zip(PROMPTS[:2], out, strict=True):
        assert [c.index for c in result.outputs] == [0, 1, 2] and result.finished
        alone = [llm.generate([prompt], SamplingParams(seed=11 + i, max_tokens=6))[0] for i in range(3)]
        assert [c.token_ids for c in result.outputs] == [a.outputs[0].token_ids for a in alone]
        assert result.spec_stats.num_draft_tokens == sum(a.spec_stats.num_draft_tokens for a in alone)
    assert out[0].request_id != out[1].request_id
    assert len({tuple(c.token_ids) for c in out[0].outputs}) > 1  # the samples differ


def test_process_logits_exact_values() -> None:
    """One request, one draft: row 0 sees output [1, 1]; row 1 sees [1, 1, 2] (the draft)."""
    logits = torch.tensor([[2.0, -1.0, 4.0, 1.0, -2.0, 0.5]] * 2)  # [R=2, V=6]
    params = [
        SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, min_tokens=3)
    ]
    history = RowHistory.of([2], [[2]], last_only=False)
    out = process_logits(logits, params, [[0]], [[1, 1]], [[5]], history)
    row0 = [2.0 / 2, -1.0 * 2 - 0.5 * 2 - 0.25, 4.0, 1.0, -2.0, -math.inf]  # 2 outputs so far < 3
    row1 = [2.0 / 2, -1.0 * 2 - 0.5 * 2 - 0.25, 4.0 / 2 - 0.5 - 0.25, 1.0, -2.0, 0.5]  # 3 outputs
    assert out.tolist() == [row0, row1]
    assert logits[0, 0] == 2.0  # the raw logits are untouched
    biased = process_logits(
        logits[:1],
        [SamplingParams(logit_bias={4: 3.0}, allowed_token_ids=[0, 4])],
        [[0]],
        [[]],
        [[]],
        RowHistory.of([1], [[]], True),
    )
    assert biased.tolist() == [[2.0, -math.inf, -math.inf, -math.inf, 1.0, -math.inf]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"presence_penalty": 3}, r"presence_penalty must be in \[-2.0, 2.0\], got 3"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty must be in \(0.0, inf\], got 0.0"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens must be <= max_tokens"),
        ({"n": 0}, "n must be an int >= 1, got 0"),
        ({"logprobs": -1}, "logprobs must be an int >= 0 or None, got -1"),
        ({"prompt_logprobs": 1.5}, "prompt_logprobs"),
        ({"logit_bias": {5: 200}}, r"logit_bias\[5\] must be in \[-100.0, 100.0\], got 200"),
        ({"logit_bias": {"x": 1}}, "logit_bias keys"),
        ({"allowed_token_ids": []}, "allowed_token_ids must name at least one"),
        ({"include_stop_str_in_output": 1}, "include_stop_str_in_output must be a bool"),
        ({"best_of": 2}, r"best_of \(removed in vLLM's v1 engine"),
        ({"guided_decoding": {}}, "guided_decoding"),
        ({"temprature": 0.5}, "does not take the argument.*temprature.*it takes:.*temperature"),
    ],
)
def test_bad_or_unknown_arguments_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_positional_arguments_refused() -> None:
    with pytest.raises(ValueError, match="keyword arguments only"):
        SamplingParams(0.5)  # type: ignore[misc]


def test_token_ids_checked_against_the_vocabulary(llm: LLM) -> None:
    for kwargs in ({"allowed_token_ids": [1, 500]}, {"logit_bias": {128: 1.0}}, {"logprobs": 129}):
        with pytest.raises(ValueError, match="vocabulary"):
            llm.generate(PROMPTS[:1], SamplingParams(**kwargs))
