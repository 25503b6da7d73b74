"""``engine/confidence.py``: which drafts each request verifies, from the drafter's confidences and the
measured step cost — exact expectations on hand-made confidences and costs."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from spec_backend.engine.confidence import (
    EXPLORE_EVERY,
    MIN_SAMPLES,
    ConfidenceVerification,
    StepCost,
    build_confidence_verification,
)
from spec_backend.metrics import SpecDecodingMetrics, SpecDecodingStats


def _cost(points: dict[int, float]) -> StepCost:
    cost = StepCost()
    for tokens, seconds in points.items():
        for _ in range(MIN_SAMPLES):
            cost.observe(tokens, seconds)
    return cost


def _ready(points: dict[int, float]) -> ConfidenceVerification:
    rule = ConfidenceVerification("throughput", cost=_cost(points))
    rule.steps = 1  # past the first exploration
    return rule


def test_step_cost_interpolates_between_and_extends_beyond_the_measured_counts() -> None:
    cost = _cost({2: 1.0, 6: 3.0})
    assert not StepCost().ready and cost.ready
    assert cost.seconds(4) == pytest.approx(2.0) and cost.seconds(2) == 1.0
    assert cost.seconds(8) == pytest.approx(4.0)  # along the last rise
    assert cost.seconds(1) == pytest.approx(0.5)
    cost.observe(2, 5.0)  # a moving average, not the last value
    assert cost.times[2][0] == pytest.approx(1.0 + 0.25 * 4.0)


def test_drafts_are_admitted_by_survival_while_throughput_grows() -> None:
    """Flat cost up to 4 tokens, then 1 s per token: with 2 requests (2 tokens), the two drafts of
    highest survival ride free; a third would need survival > expected/seconds to pay."""
    rule = _ready({2: 1.0, 4: 1.0, 5: 2.0})
    # survivals: request 0 -> 0.9, 0.72, 0.36; request 1 -> 0.5, 0.45
    lengths = rule.lengths([[0.9, 0.8, 0.5], [0.5, 0.9]], [3, 2], [True, True])
    assert lengths == [2, 0]  # 0.9 and 0.72 admitted (free); 0.5 would halve the rate: stop
    free = _ready({2: 1.0, 8: 1.0})  # every token free: every draft
    assert free.lengths([[0.9, 0.8, 0.5], [0.5, 0.9]], [3, 2], [True, True]) == [3, 2]


def test_a_request_may_verify_nothing_and_ties_go_to_the_earlier_draft() -> None:
    rule = _ready({2: 1.0, 3: 1.0, 4: 2.0})  # one free draft for the batch
    assert rule.lengths([[0.3], [0.8, 1.0]], [1, 2], [True, True]) == [0, 1]
    rule = _ready({1: 1.0, 2: 1.0, 3: 5.0})
    assert rule.lengths([[1.0, 1.0]], [2], [True]) == [1]  # equal survivals: the first draft first


def test_requests_that_do_not_adapt_keep_every_draft_and_count_in_the_rate() -> None:
    rule = _ready({2: 1.0, 5: 1.0, 6: 10.0})
    assert rule.lengths([[0.9, 0.9, 0.9], [0.9, 0.9]], [3, 2], [False, True]) == [3, 0]


def test_exploration_alternates_every_draft_and_none_until_two_counts_are_trusted() -> None:
    rule = ConfidenceVerification("throughput")
    seen = [rule.lengths([[0.1, 0.1]], [2], [True]) for _ in range(2 * MIN_SAMPLES)]
    assert seen == [[2]] * MIN_SAMPLES + [[0]] * MIN_SAMPLES
    rule = _ready({1: 1.0, 2: 50.0})
    rule.steps = EXPLORE_EVERY - 1
    assert rule.lengths([[0.1, 0.1]], [2], [True]) == [2]  # a periodic re-measurement of the top
    assert rule.lengths([[0.1, 0.1]], [2], [True]) == [0]


def test_the_threshold_rule_stops_at_the_first_unconfident_draft() -> None:
    rule = ConfidenceVerification("threshold", threshold=0.5)
    assert rule.lengths([[0.9, 0.4, 0.9], [0.3], [0.6, 0.6]], [3, 1, 1], [True, False, True]) == [1, 0, 1]
    assert ConfidenceVerification("threshold", 0.0).lengths([[0.0, 0.0]], [2], [True]) == [2]


def test_building_the_rule() -> None:
    assert build_confidence_verification(None, None, drafter_reports=False) is None
    assert build_confidence_verification("off", None, drafter_reports=True) is None
    rule = build_confidence_verification(None, None, drafter_reports=True)
    assert rule is not None and rule.mode == "throughput" and rule.timed
    rule = build_confidence_verification("threshold", 0.3, drafter_reports=True)
    assert rule is not None and rule.threshold == 0.3 and not rule.timed


def test_verify_lengths_are_recorded_in_the_metrics() -> None:
    metrics = SpecDecodingMetrics(log_interval_s=None)
    metrics.observe_verify_lengths([0, 2, 2], [3, 2, 4])
    other = SpecDecodingStats()
    other.observe_verify_lengths([1], [1])
    metrics.total.merge(other)
    assert metrics.total.verify_lengths == [1, 1, 2] and metrics.total.num_confidence_skipped_tokens == 5
    assert metrics.total.as_dict()["verify_lengths"] == [1, 1, 2]
    assert "verified drafts per request (by confidence): [1, 1, 2], skipped: 5" in metrics.total.log_line()
    sample = metrics.registry.get_sample_value(
        "spec_backend_spec_decode_confidence_verify_length_total", {"length": "2"}
    )
    assert sample == 2.0
    assert (
        metrics.registry.get_sample_value("spec_backend_spec_decode_confidence_skipped_tokens_total") == 5.0
    )


def _stops_before_seeing_the_draft(rule: Callable[[list[list[float]]], list[int]], trials: int = 300) -> bool:
    """Whether ``rule``'s decision to verify draft ``k`` of request ``r`` never changes when the
    confidences after ``k`` change: those are the only ones that depend on draft ``k``'s token (the
    confidence of draft ``k + 1`` reads it as its previous token), so this is what keeps verification
    lossless (a stopping rule)."""
    gen = random.Random(7)
    for _ in range(trials):
        conf = [[gen.random() for _ in range(gen.randint(1, 4))] for _ in range(gen.randint(1, 4))]
        lengths = rule(conf)
        r = gen.randrange(len(conf))
        k = gen.randrange(len(conf[r]))
        changed = [list(c) for c in conf]
        changed[r][k + 1 :] = [gen.random() for _ in changed[r][k + 1 :]]
        if (lengths[r] > k) != (rule(changed)[r] > k):
            return False
    return True


def test_every_rule_decides_each_draft_before_seeing_it() -> None:
    def throughput(conf: list[list[float]]) -> list[int]:
        tokens = len(conf)
        rule = _ready({tokens: 1.0, tokens + 3: 1.2, tokens + 6: 4.0})
        return rule.lengths(conf, [len(c) for c in conf], [True] * len(conf))

    def threshold(conf: list[list[float]]) -> list[int]:
        return ConfidenceVerification("threshold", 0.5).lengths(
            conf, [len(c) for c in conf], [True] * len(conf)
        )

    def peeking(conf: list[list[float]]) -> list[int]:  # negative control: stops on the next confidence
        return threshold([[*c[1:], 1.0] for c in conf])

    assert _stops_before_seeing_the_draft(throughput) and _stops_before_seeing_the_draft(threshold)
    assert not _stops_before_seeing_the_draft(peeking)
