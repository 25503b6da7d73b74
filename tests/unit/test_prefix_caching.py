"""Automatic prefix caching in the engine (issue 40, item 1; ``engine/prefix.py``): outputs with cache
hits equal outputs without the cache, token for token, for every drafter, greedy and seeded sampled;
the number of cached prompt positions is exact; a draft model's cache is reused and its drafts are
unchanged; entries are really used (a negative control corrupts them and the outputs change); a small
budget evicts and stays equal; ``prompt_logprobs`` requests compute every row; bad settings are
refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import one_thread, record_drafts  # noqa: F401  (module fixture: one thread)
from test_engine_context_limit import SPECS

from spec_backend.engine import LLM, SamplingParams
from spec_backend.tools.tiny import make_tiny_model

BS = 8
SHARED = [(i * 7) % 100 + 2 for i in range(40)]  # five whole blocks
PROMPTS = [
    [*SHARED, 5, 6, 7, 5, 6, 7, 5],  # 47 tokens
    [*SHARED, 9, 10, 9, 10],  # 44
    [*SHARED[:20], 3, 4, 3, 4, 3],  # 25: shares two whole blocks
    SHARED + SHARED[:9],  # 49: six whole blocks
]
#: positions served from the cache with two requests running at a time: the first call's later pair
#: finds the first pair's blocks; the second call finds every whole block (at most the prompt minus one)
FIRST_CALL = [0, 0, 16, 40]
SECOND_CALL = [40, 40, 24, 48]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("prefix"), "llama")


def _llm(target: str, spec: Any, **kwargs: Any) -> LLM:
    return LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=2, **kwargs)


def _tokens(outputs: list[Any]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("method", sorted(SPECS))
def test_outputs_with_hits_equal_outputs_without_the_cache(method: str, target: str, tmp_path: Path) -> None:
    spec = SPECS[method](target, tmp_path)
    want = _tokens(_llm(target, spec, enable_prefix_caching=False).generate(PROMPTS, GREEDY))
    llm = _llm(target, spec, block_size=BS)
    first = llm.generate(PROMPTS, GREEDY)
    second = llm.generate(PROMPTS, GREEDY)
    assert [o.num_cached_tokens for o in first] == FIRST_CALL
    assert [o.num_cached_tokens for o in second] == SECOND_CALL
    assert _tokens(first) == want and _tokens(second) == want
    if method != "ngram":
        return
    drafted = sum(o.spec_stats.num_draft_tokens for o in second)
    accepted = sum(o.spec_stats.num_accepted_tokens for o in second)
    assert drafted > accepted > 0  # drafts both accepted and rejected after hits


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_the_drafts_after_a_hit_are_the_drafts_without_it(method: str, target: str, tmp_path: Path) -> None:
    """The drafter's state after a hit is the state it builds without one: every step proposes the
    same drafts (a draft model from its reloaded cache, EAGLE-3 from the stored hidden states)."""
    spec = SPECS[method](target, tmp_path)
    plain = _llm(target, spec, enable_prefix_caching=False)
    want = record_drafts(plain)
    plain.generate(PROMPTS[3:], GREEDY)
    cached = _llm(target, spec, block_size=BS)
    cached.generate(PROMPTS[3:], GREEDY)
    got = record_drafts(cached)
    out = cached.generate(PROMPTS[3:], GREEDY)
    assert out[0].num_cached_tokens == 48 and got == want


def test_a_draft_model_reuses_its_cache(target: str, tmp_path: Path) -> None:
    """After a hit the draft model computes only the positions after it (its catch-up forward feeds the
    rest of the prompt and the first output token), instead of the whole prompt."""
    llm = _llm(target, SPECS["draft_model"](target, tmp_path), block_size=BS)
    runner: Any = llm.engine.drafter.runner  # type: ignore[union-attr]
    forward, fed = runner.forward, []

    def spy(batch: Any, last_only: bool) -> Any:
        fed.append(batch.num_tokens)
        return forward(batch, last_only)

    runner.forward = spy
    firsts = []
    for _ in range(2):
        fed.clear()
        out = llm.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=3))
        firsts.append(fed[0])
    assert out[0].num_cached_tokens == 40
    assert firsts == [len(PROMPTS[0]) + 1, len(PROMPTS[0]) + 1 - 40]


def test_seeded_samples_with_hits_equal_samples_without(target: str, tmp_path: Path) -> None:
    params = [SamplingParams(temperature=0.9, max_tokens=16, seed=11 + i) for i in range(len(PROMPTS))]
    for method in ("ngram", "eagle"):
        spec = SPECS[method](target, tmp_path)
        want = _tokens(_llm(target, spec, enable_prefix_caching=False).generate(PROMPTS, params))
        llm = _llm(target, spec, block_size=BS)
        assert _tokens(llm.generate(PROMPTS, params)) == want
        second = llm.generate(PROMPTS, params)
        assert [o.num_cached_tokens for o in second] == SECOND_CALL and _tokens(second) == want


def test_corrupted_entries_change_the_outputs(target: str) -> None:
    """Negative control: the equality above is not vacuous, the entries are what a hit computes with."""
    llm = _llm(target, None, block_size=BS)
    want = _tokens(llm.generate(PROMPTS, GREEDY))
    prefix = llm.engine.prefix
    assert prefix is not None
    with torch.inference_mode():
        for entry in prefix.cache._entries.values():
            for kv in entry.kv:
                if kv is not None:
                    kv[0].mul_(-3.0)  # keys
                    kv[1].add_(1.0)  # values
    got = llm.generate(PROMPTS, GREEDY)
    assert [o.num_cached_tokens for o in got] == SECOND_CALL
    assert _tokens(got) != want


def test_a_small_budget_evicts_and_stays_equal(target: str) -> None:
    want = _tokens(_llm(target, None, enable_prefix_caching=False).generate(PROMPTS, GREEDY))
    block = BS * LLM(target).engine.runner.cache.layout.bytes_per_position
    small = _llm(target, None, block_size=BS, prefix_cache_memory_bytes=3 * block)
    budget = small.engine.prefix.cache  # type: ignore[union-attr]
    for _ in range(2):
        assert _tokens(small.generate(PROMPTS, GREEDY)) == want
        assert budget.nbytes <= 3 * block and len(budget) <= 3
    assert 0 < budget.hit_tokens < sum(FIRST_CALL) + sum(SECOND_CALL)  # what an ample budget serves


def test_prompt_logprobs_requests_compute_every_row(target: str) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2)
    want = _llm(target, None, enable_prefix_caching=False).generate(PROMPTS[:1], params)[0]
    llm = _llm(target, None, block_size=BS)
    llm.generate(PROMPTS[:1], GREEDY)  # stores the prompt's blocks
    got = llm.generate(PROMPTS[:1], params)[0]
    assert got.num_cached_tokens == 0 and got.prompt_logprobs is not None
    assert got.prompt_logprobs == want.prompt_logprobs
    assert llm.generate(PROMPTS[:1], GREEDY)[0].num_cached_tokens == 40  # the cache still serves others


def test_logprobs_after_a_hit_equal_up_to_rounding(target: str) -> None:
    """A hit computes the prompt's last rows in a smaller batch than a whole prefill: in float32 the
    logprobs may differ in the last bits (a different summation order), never more; tokens are equal."""
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=3)
    plain = LLM(target, dtype="float32", enable_prefix_caching=False).generate(PROMPTS, params)
    llm = LLM(target, dtype="float32", block_size=BS)
    llm.generate(PROMPTS, params)
    cached = llm.generate(PROMPTS, params)
    assert [o.num_cached_tokens for o in cached] == SECOND_CALL and _tokens(cached) == _tokens(plain)
    for got, want in zip(cached, plain, strict=True):
        for got_entry, want_entry in zip(got.outputs[0].logprobs, want.outputs[0].logprobs, strict=True):
            assert got_entry.keys() == want_entry.keys()
            for token, lp in want_entry.items():
                assert abs(got_entry[token].logprob - lp.logprob) < 1e-5


def test_a_cache_salt_shares_blocks_only_with_the_same_salt(target: str) -> None:
    """vLLM's ``cache_salt`` in a dict prompt: a request finds the blocks of earlier requests with the
    same salt only (salted and unsalted requests never share); outputs are the same in every case."""
    llm = _llm(target, None, block_size=BS)
    want = _tokens(llm.generate(PROMPTS[:1], GREEDY))  # unsalted: stores the prompt's blocks

    def run(salt: str, n: int = 1) -> list[Any]:
        prompt = {"prompt_token_ids": PROMPTS[0], "cache_salt": salt}
        return llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16, n=n))

    first, again, other = run("a"), run("a"), run("b")
    assert [o.num_cached_tokens for o in (first[0], again[0], other[0])] == [0, 40, 0]
    assert all(_tokens(o) == want for o in (first, again, other))
    assert llm.generate(PROMPTS[:1], GREEDY)[0].num_cached_tokens == 40  # the unsalted blocks are there
    samples = run("a", n=2)[0]  # every sample carries its prompt's salt
    assert samples.num_cached_tokens == 40 and [s.token_ids for s in samples.outputs] == want * 2


def test_disabled_caching_serves_nothing(target: str) -> None:
    llm = _llm(target, None, enable_prefix_caching=False)
    assert llm.engine.prefix is None
    for _ in range(2):
        assert [o.num_cached_tokens for o in llm.generate(PROMPTS, GREEDY)] == [0, 0, 0, 0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"enable_prefix_caching": "yes"}, "enable_prefix_caching must be a bool or None .on., got 'yes'"),
        ({"block_size": 0}, r"block_size must be None \(16\) or an int in \[1, 4096\], got 0"),
        ({"prefix_cache_memory_bytes": -1}, "prefix_cache_memory_bytes must be None or an int >= 1"),
        (
            {"enable_prefix_caching": False, "prefix_cache_memory_bytes": 10**6},
            "enable_prefix_caching=False turns it off",
        ),
        ({"prefix_cache_memory_bytes": 100}, "prefix_cache_memory_bytes=100 cannot hold one block of 16"),
    ],
)
def test_bad_settings_are_refused_by_name(target: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LLM(target, **kwargs)


def test_the_default_is_on_with_16_position_blocks(target: str) -> None:
    llm = LLM(target)
    prefix = llm.engine.prefix
    assert prefix is not None and prefix.cache.block_size == 16
    per_position = llm.engine.runner.cache.layout.bytes_per_position
    assert prefix.cache.max_bytes == 4 * per_position * llm.max_model_len
    assert torch.get_num_threads() == 1  # the module fixture is active (tiny models, one thread)


def test_the_default_budget_follows_a_kv_budget_and_holds_a_block(target: str) -> None:
    """With ``kv_cache_memory_bytes`` the default prefix budget is at most that (a bounded engine at
    most doubles); a context shorter than a block still builds (one block's budget, nothing to store)."""
    per_position = LLM(target).engine.runner.cache.layout.bytes_per_position
    kv = 3 * per_position * 128  # three requests of 128 positions
    bounded = LLM(target, max_model_len=128, kv_cache_memory_bytes=kv).engine.prefix
    assert bounded is not None and bounded.cache.max_bytes == kv
    short = LLM(target, max_model_len=3)  # four requests hold 12 positions, fewer than a block's 16
    assert short.engine.prefix is not None and short.engine.prefix.cache.max_bytes == 16 * per_position
    outputs = short.generate([[5, 6]] * 2, SamplingParams(temperature=0.0, max_tokens=1))
    assert [o.num_cached_tokens for o in outputs] == [0, 0]
