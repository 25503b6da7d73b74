"""Engine guarantees on tiny random models: greedy identity, seeded reproducibility, batching."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import PROMPTS, fixed_ngram, one_thread  # noqa: F401 - one_thread is an autouse fixture

from spec_backend.engine import LLM, SamplingParams
from spec_backend.tools.tiny import make_tiny_model

NGRAM = fixed_ngram(4, 3)
SUFFIX = {
    "adaptive_draft_length": False,
    "method": "suffix",
    "num_speculative_tokens": 4,
    "suffix_decoding_min_token_prob": 0.0,
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("qwen2"), "qwen2", seed=1)


_HF_CACHE: dict[str, list[list[int]]] = {}


def hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' own greedy decoding, one prompt at a time, in float64 (memoised per model)."""
    key = f"{model_dir}:{prompts}:{max_new_tokens}"
    if key not in _HF_CACHE:
        _HF_CACHE[key] = _hf_greedy(model_dir, prompts, max_new_tokens)
    return _HF_CACHE[key]


def _hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    outs = []
    for p in prompts:
        ids = model.generate(torch.tensor([p]), max_new_tokens=max_new_tokens, do_sample=False)
        outs.append(ids[0, len(p) :].tolist())
    return outs


def token_ids(outputs: list) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("spec", [None, NGRAM, SUFFIX], ids=["plain", "ngram", "suffix"])
def test_greedy_matches_transformers_generate(
    arch: str, spec: dict | None, request: pytest.FixtureRequest
) -> None:
    model_dir = request.getfixturevalue(f"{arch}_dir")
    expected = hf_greedy(model_dir, PROMPTS, GREEDY.max_tokens)
    batched = LLM(model_dir, speculative_config=spec, dtype="float64").generate(PROMPTS, GREEDY)
    assert token_ids(batched) == expected
    assert all(o.outputs[0].finish_reason == "length" for o in batched)
    if spec is not None:
        assert sum(o.num_draft_tokens for o in batched) > 0  # speculation really ran
        assert sum(o.num_accepted_tokens for o in batched) > 0


def test_greedy_single_equals_batched_with_continuous_batching(llama_dir: str) -> None:
    single = LLM(llama_dir, speculative_config=NGRAM, dtype="float64")
    alone = [token_ids(single.generate([p], GREEDY))[0] for p in PROMPTS]
    # more prompts than max_num_seqs: requests join as others leave (different max_tokens)
    prompts = PROMPTS * 2
    params = [SamplingParams(temperature=0.0, max_tokens=24 if i % 3 else 7) for i in range(len(prompts))]
    llm = LLM(llama_dir, speculative_config=NGRAM, dtype="float64", max_num_seqs=3)
    outs = llm.generate(prompts, params)
    assert len(outs) == len(prompts)
    assert len({o.request_id for o in outs}) == len(prompts)
    for i, (o, p) in enumerate(zip(outs, params, strict=True)):
        assert o.prompt_token_ids == prompts[i]
        assert o.outputs[0].token_ids == alone[i % len(PROMPTS)][: p.max_tokens]
    assert llm.engine.runner.cache.num_slots == 0  # every slot released


def test_float32_greedy_speculative_equals_plain(llama_dir: str) -> None:
    plain = LLM(llama_dir).generate(PROMPTS, GREEDY)
    spec = LLM(llama_dir, speculative_config=NGRAM, max_num_seqs=2).generate(PROMPTS, GREEDY)
    assert token_ids(plain) == token_ids(spec)


@pytest.mark.parametrize("spec", [None, NGRAM], ids=["plain", "ngram"])
def test_seeded_sampling_independent_of_batch(llama_dir: str, spec: dict | None) -> None:
    llm = LLM(llama_dir, speculative_config=spec, dtype="float64")
    seeded = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1234, max_tokens=20)
    alone = token_ids(llm.generate([PROMPTS[0]], seeded))[0]
    others = [SamplingParams(temperature=1.0, max_tokens=n) for n in (5, 30, 12)]
    mixed = llm.generate(
        [PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[3]], [others[0], seeded, others[1], others[2]]
    )
    assert mixed[1].outputs[0].token_ids == alone
    again = LLM(llama_dir, speculative_config=spec, dtype="float64", max_num_seqs=1).generate(
        [PROMPTS[0]], seeded
    )
    assert token_ids(again)[0] == alone


def test_engine_seed_makes_unseeded_requests_reproducible(llama_dir: str) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=12)
    a = LLM(llama_dir, speculative_config=NGRAM, seed=7).generate(PROMPTS, params)
    b = LLM(llama_dir, speculative_config=NGRAM, seed=7).generate(PROMPTS, params)
    assert token_ids(a) == token_ids(b)


def test_max_tokens_truncates_accepted_drafts(llama_dir: str) -> None:
    llm = LLM(llama_dir, speculative_config=NGRAM, dtype="float64")
    full = token_ids(llm.generate([PROMPTS[0]], GREEDY))[0]
    for n in (1, 2, 3, 5):
        out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=n))[0]
        assert out.outputs[0].token_ids == full[:n]
        assert out.outputs[0].finish_reason == "length"


def test_eos_and_stop_token_inside_drafts_truncate(llama_dir: str) -> None:
    llm = LLM(llama_dir, speculative_config=NGRAM, dtype="float64")
    full = token_ids(llm.generate([PROMPTS[2]], GREEDY))[0]
    stop_at = 9
    stop_token = full[stop_at]
    cut = full.index(stop_token) + 1
    out = llm.generate(
        [PROMPTS[2]], SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop_token])
    )[0]
    assert out.outputs[0].token_ids == full[:cut]
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop_token
    llm.eos_token_ids = frozenset({stop_token})
    out = llm.generate([PROMPTS[2]], GREEDY)[0]
    assert out.outputs[0].token_ids == full[:cut]
    assert out.outputs[0].finish_reason == "stop"
    ignored = llm.generate([PROMPTS[2]], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0]
    assert ignored.outputs[0].token_ids == full


def test_disable_by_batch_size(llama_dir: str) -> None:
    spec = {**NGRAM, "disable_by_batch_size": 2}
    llm = LLM(llama_dir, speculative_config=spec, dtype="float64")
    short = SamplingParams(temperature=0.0, max_tokens=4)
    batched = llm.generate(PROMPTS[:3], [GREEDY, short, short])
    assert batched[0].num_draft_tokens > 0  # speculation resumes once one request is left
    assert batched[1].num_draft_tokens == batched[2].num_draft_tokens == 0
    single = llm.generate([PROMPTS[0]], GREEDY)
    assert single[0].num_draft_tokens > 0
    off = llm.generate(PROMPTS, GREEDY)  # all finish together: the batch never drops below 2
    assert sum(o.num_draft_tokens for o in off) == 0
    assert token_ids(off) == token_ids(LLM(llama_dir, dtype="float64").generate(PROMPTS, GREEDY))


@pytest.mark.parametrize(
    "additional",
    [
        {"rejection_sampler_config": {"enable_block_verify": True}},
        '{"rejection_sampler_config": {"enable_block_verify": true, "block_verify_mode": "cumulative"}}',
        {"rejection_sampler_config": {"enable_entropy_verify": True}},
    ],
    ids=["block-lossless", "block-cumulative", "entropy"],
)
def test_sampler_modes_via_additional_config(llama_dir: str, additional: dict | str) -> None:
    llm = LLM(llama_dir, speculative_config=NGRAM, additional_config=additional, dtype="float64")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.9, seed=3, max_tokens=16))
    assert [len(t) for t in token_ids(outs)] == [16] * len(PROMPTS)
    greedy = llm.generate(PROMPTS, GREEDY)  # every mode is exact at temperature 0
    assert token_ids(greedy) == token_ids(LLM(llama_dir, dtype="float64").generate(PROMPTS, GREEDY))


def test_synthetic_acceptance_rates(llama_dir: str) -> None:
    spec = {
        **NGRAM,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [1.0, 1.0, 1.0, 1.0],
    }
    llm = LLM(llama_dir, speculative_config=spec)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16))
    assert [len(t) for t in token_ids(outs)] == [16] * len(PROMPTS)
    stats = llm.metrics.total
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens


def test_failing_request_reports_error_without_killing_others(
    llama_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = LLM(llama_dir, speculative_config=NGRAM, dtype="float64")
    expected = token_ids(llm.generate(PROMPTS, GREEDY))
    proposer = llm.engine.drafter.proposer  # the host proposer behind the HostDrafter adapter
    original = proposer.propose
    bad_id = str(llm._next_id + 1)  # the second request of the next generate() call

    def flaky(req_ids: list[str], max_tokens: list[int] | None = None) -> list[list[int]]:
        if bad_id in req_ids:
            raise RuntimeError("drafter exploded")
        return original(req_ids, max_tokens=max_tokens)

    monkeypatch.setattr(proposer, "propose", flaky)
    outs = llm.generate(PROMPTS, GREEDY)
    assert outs[1].outputs[0].finish_reason == "error"
    assert "drafter exploded" in (outs[1].outputs[0].error or "")
    for i in (0, 2, 3):
        assert outs[i].outputs[0].finish_reason == "length"
        assert outs[i].outputs[0].token_ids == expected[i]


def test_failure_inside_a_batched_step_is_isolated(llama_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(llama_dir, speculative_config=NGRAM, dtype="float64")
    expected = token_ids(llm.generate(PROMPTS, GREEDY))
    verifier = llm.engine.verifier
    bad_id = str(llm._next_id + 2)
    calls = {"n": 0}

    launch = verifier.launch

    def flaky(batch: Any, requests: list, logits: torch.Tensor, *args: Any) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] > 3 and any(r.request_id == bad_id for r in requests):
            raise RuntimeError("kernel fault")
        return launch(batch, requests, logits, *args)

    monkeypatch.setattr(verifier, "launch", flaky)
    outs = llm.generate(PROMPTS, GREEDY)
    assert outs[2].outputs[0].finish_reason == "error" and "kernel fault" in (outs[2].outputs[0].error or "")
    assert 0 < len(outs[2].outputs[0].token_ids) < GREEDY.max_tokens
    for i in (0, 1, 3):
        assert outs[i].outputs[0].token_ids == expected[i]
