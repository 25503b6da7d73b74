"""The start-up profile of a decode step's cost against its query rows (``engine/cost_profile.py``) and the
adaptive policy that starts from it: slopes from given timings, interpolation between batch sizes, no
step verifying drafts only to time them, and the profile's dummy forwards leaving no trace in an engine
(eager and through the simulated graph driver)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - autouse
from test_captured_verify import StrictGraphs

from spec_backend.engine import LLM, SamplingParams
from spec_backend.engine.adaptive import MIN_SAMPLES, AdaptiveDraftLength, interpolated
from spec_backend.engine.cost_profile import (
    PROFILE_REPEATS,
    forward_timer,
    profile_sizes,
    profile_slopes,
)
from spec_backend.tools.tiny import make_tiny_model

K = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
ADAPTIVE = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("profile"), "llama")


def test_the_profiled_batch_sizes() -> None:
    assert profile_sizes(16) == [1, 2, 4, 8, 16]
    assert profile_sizes(12) == [1, 2, 4, 8, 12]
    assert profile_sizes(1) == [1]
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1, got 0"):
        profile_sizes(0)


def _timer(per_row: float, noise: dict[tuple[int, int], float] | None = None) -> Any:
    """A step timer: ``batch * (1 + per_row * (rows - 1))`` seconds, ``noise[(batch, rows)]`` added to the
    first call of each shape after its warm-up call (an outlier the median must drop)."""
    calls: dict[tuple[int, int], int] = {}

    def time_step(batch: int, rows: int) -> float:
        n = calls[batch, rows] = calls.get((batch, rows), 0) + 1
        extra = (noise or {}).get((batch, rows), 0.0) if n == 2 else 0.0
        return batch * (1.0 + per_row * (rows - 1)) + extra

    return time_step


def test_slopes_are_each_rows_share_of_a_plain_step_or_the_whole_verify_steps() -> None:
    """A verify forward of K+1 rows taking 1.4 plain forwards: 0.1 a draft row eagerly, 0.4 a captured
    verify step (``fixed_width``); an outlier timing is the median's to drop, and a verify forward timed
    faster than a plain one costs nothing (never a negative slope)."""
    outlier = {(2, 1): 50.0, (4, K + 1): 50.0}
    eager = profile_slopes(_timer(0.1, outlier), K, [1, 2, 4], fixed_width=False, budget_s=1e9)
    assert eager == pytest.approx({1: 0.1, 2: 0.1, 4: 0.1})
    flat = profile_slopes(_timer(0.1), K, [1, 8], fixed_width=True, budget_s=1e9)
    assert flat == pytest.approx({1: 0.4, 8: 0.4})
    assert profile_slopes(_timer(-0.1), K, [1], fixed_width=False) == {1: 0.0}
    with pytest.raises(ValueError, match="k >= 1 and repeats >= 1, got k=0"):
        profile_slopes(_timer(0.1), 0, [1], fixed_width=False)


def test_each_shape_is_timed_once_to_warm_up_then_repeats_times() -> None:
    seen: list[tuple[int, int]] = []

    def time_step(batch: int, rows: int) -> float:
        seen.append((batch, rows))
        return 1.0

    profile_slopes(time_step, K, [1, 2], fixed_width=False, budget_s=1e9)
    expected = [
        shape
        for b in (1, 2)
        for shape in [(b, 1), (b, K + 1)] + [(b, 1)] * PROFILE_REPEATS + [(b, K + 1)] * PROFILE_REPEATS
    ]
    assert seen == expected


def test_larger_batch_sizes_are_left_to_online_timing_once_the_budget_is_spent() -> None:
    """The forwards' times add up as sizes are profiled from the smallest: at 1 request 9.6 s (a warm-up of
    each shape, three plain and three verify forwards), at 2 requests 19.2 s more; with a 20 s budget the
    profile stops after 2 requests, and the policy measures larger batches online (no seeded samples), as
    it does without a profile. Negative control: an ample budget profiles every size."""
    assert sorted(profile_slopes(_timer(0.1), K, [1, 2, 4, 8], False, budget_s=20.0)) == [1, 2]
    assert sorted(profile_slopes(_timer(0.1), K, [1, 2, 4, 8], False, budget_s=1e9)) == [1, 2, 4, 8]
    policy = AdaptiveDraftLength(K, profile={1: 0.1, 2: 0.2})
    assert policy.batch(2).samples == MIN_SAMPLES and policy.batch(2).slope == pytest.approx(0.2)
    assert policy.batch(4).samples == 0 and policy.batch(4).slope == 0.0


def test_a_batch_size_between_two_profiled_ones_interpolates() -> None:
    profile = {1: 0.1, 4: 0.4, 8: 0.2}
    assert interpolated(profile, 2) == pytest.approx(0.2)
    assert interpolated(profile, 6) == pytest.approx(0.3)
    assert interpolated(profile, 1) == 0.1 and interpolated(profile, 64) == 0.2
    with pytest.raises(ValueError, match="empty profile"):
        interpolated({}, 1)


def _choices(policy: AdaptiveDraftLength, acceptance: float, steps: int) -> list[int]:
    """``steps`` decisions at one request, each step timed at 1 s plain and 1 + 0.5 drafting."""
    choices = []
    for _ in range(steps):
        k = policy.choose(1, [acceptance])
        policy.observe(1, k, 1.0 if k == 0 else 1.5, [k], 0)
        choices.append(k)
    return choices


@pytest.mark.parametrize(("acceptance", "drafts"), [(0.1, False), (0.9, True)])
def test_a_profiled_policy_never_verifies_drafts_only_to_time_them(acceptance: float, drafts: bool) -> None:
    """With a profile (a draft row 0.125 of a plain step), the choice after the plain steps is the rates':
    plain decoding at acceptance 0.1, K at 0.9 (a drafter that cannot shadow is taken to fill its budget
    until verify steps say otherwise). Negative control: without a profile, K is verified to time it
    (``MIN_SAMPLES`` steps after the plain ones) whatever the acceptance."""
    profiled = AdaptiveDraftLength(K, profile={1: 0.5 / K})
    got = _choices(profiled, acceptance, 20)
    assert got == [0] * MIN_SAMPLES + [K if drafts else 0] * (20 - MIN_SAMPLES)
    unprofiled = _choices(AdaptiveDraftLength(K), acceptance, 20)
    assert unprofiled[MIN_SAMPLES : 2 * MIN_SAMPLES] == [K] * MIN_SAMPLES


def test_a_shadowing_drafters_reach_starts_at_none_with_a_profile() -> None:
    """An n-gram or suffix lookup often finds nothing: with a profile its reach starts at 0 and comes from
    shadows (plain decoding until they find drafts); a drafter that cannot shadow starts at its budget."""
    shadowed = AdaptiveDraftLength(K, profile={1: 0.5 / K}, shadowed=True)
    assert _choices(shadowed, 0.9, 10) == [0] * 10
    assert shadowed.batches[1].reach == [0.0] * K
    assert AdaptiveDraftLength(K, profile={1: 0.1, 4: 0.2}).batch(3).reach == [1.0] * K


def test_an_engine_profiles_its_forward_at_start_and_leaves_no_trace(
    target: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``LLM`` with adaptive drafting (the default) profiles every batch size of ``profile_sizes`` and
    logs it; the engine holds no slot after, and its greedy tokens are plain decoding's. Negative control:
    with adaptive drafting off, nothing is profiled."""
    with caplog.at_level(logging.INFO, logger="spec_backend.engine"):
        llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE, max_num_seqs=4)
    adaptive = llm.engine.adaptive
    assert adaptive is not None and sorted(adaptive.profile) == [1, 2, 4]
    assert all(s >= 0.0 for s in adaptive.profile.values())
    assert "start-up profile" in caplog.text
    assert llm.engine.slots.num_slots == 0 and not llm.engine.runner.cache.lengths
    plain = LLM(target, dtype="float64").generate(PROMPTS[:3], GREEDY)
    out = llm.generate(PROMPTS[:3], GREEDY)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in plain]
    fixed = LLM(target, dtype="float64", speculative_config={**ADAPTIVE, "adaptive_draft_length": False})
    assert fixed.engine.adaptive is None


def test_the_profile_replays_the_graphs_a_step_would(target: str) -> None:
    """Through the strict simulated graph driver: the profile's forwards replay the captured verify and
    one-token graphs (their replay counts grow), the cache is left zeroed and idle, and sampled seeded
    tokens equal the eager engine's."""
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=16)
    llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE, backend=StrictGraphs(), max_num_seqs=2)
    captured, plain = llm.engine.captured, llm.engine.captured_plain
    assert captured is not None and plain is not None
    replays = {q: graph.graph.replays for q, graph in ((K + 1, captured), (1, plain))}
    assert all(n > 0 for n in replays.values()), replays
    assert llm.engine.slots.num_slots == 0
    eager = LLM(target, dtype="float64", speculative_config=ADAPTIVE)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], params)] == [
        o.outputs[0].token_ids for o in eager.generate(PROMPTS[:2], params)
    ]


def test_a_token_trees_engine_is_not_profiled_and_starts(target: str) -> None:
    """A token tree with adaptive drafting asked for: its step feeds ``1 + nodes`` rows and its captured
    graph a tree mask, which the chain's profile does not time. Failed before: the profile replayed the
    tree's graph without a tree and ``LLM(...)`` raised; now the engine starts, profiles nothing, and its
    greedy tokens are plain decoding's, captured and eager."""
    tree = "[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]"
    spec = {
        **ADAPTIVE,
        "num_speculative_tokens": 3,
        "speculative_token_tree": tree,
        "adaptive_draft_length": True,
    }
    plain = [o.outputs[0].token_ids for o in LLM(target, dtype="float64").generate(PROMPTS[:2], GREEDY)]
    for backend in (StrictGraphs(), None):
        kwargs: dict[str, Any] = {"backend": backend} if backend is not None else {}
        llm = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=2, **kwargs)
        assert llm.engine.adaptive is not None and llm.engine.adaptive.profile == {}
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], GREEDY)] == plain


def test_the_timer_refuses_an_engine_holding_requests(target: str) -> None:
    llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE, max_num_seqs=2)
    llm.engine.slots.add()
    with pytest.raises(RuntimeError, match="needs an idle engine, 1 slot"):
        forward_timer(llm.engine)(1, 1)
