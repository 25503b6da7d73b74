"""Shadow drafts (``engine/shadow_drafts.py``): drafts proposed for greedy requests that adaptive drafting
gave none, checked against the tokens the requests then emit — exactly what a verify step would have
accepted — so the policy's acceptance keeps up while nothing is verified."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - autouse

from spec_backend.engine import LLM, SamplingParams
from spec_backend.engine.adaptive import MIN_SAMPLES, AdaptiveDraftLength
from spec_backend.engine.shadow_drafts import SHADOW_EVERY, SHADOW_MAX, ShadowDrafts
from spec_backend.proposers.ngram import build_ngram_proposer

K = 4
ADAPTIVE_NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": K,
    "prompt_lookup_min": 1,
    "adaptive_draft_length": True,
}


@dataclass
class FakeRequest:
    request_id: str
    output_token_ids: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def finished(self) -> bool:
        return self.done


def test_a_shadow_counts_the_drafts_up_to_the_first_that_differs() -> None:
    shadows, request = ShadowDrafts(), FakeRequest("a", [5])
    shadows.record(request, [7, 8, 9, 4], step=1)
    request.output_token_ids += [7, 8]
    assert shadows.resolve([request]) == (0, 0)  # the two tokens so far match: not decided yet
    request.output_token_ids += [1]
    assert shadows.resolve([request]) == (4, 2)  # 9 was not emitted: drafted 4, accepted 2
    assert shadows.counts_of("a") == (4, 2) and not shadows.open


def test_a_shadow_whose_drafts_all_come_is_decided_when_the_last_does() -> None:
    shadows, request = ShadowDrafts(), FakeRequest("a")
    shadows.record(request, [3, 4], step=1)
    request.output_token_ids += [3, 4, 6]
    assert shadows.resolve([request]) == (2, 2)


def test_a_finished_request_drops_its_undecided_shadow_and_forget_clears_it() -> None:
    shadows, request = ShadowDrafts(), FakeRequest("a")
    shadows.record(request, [3, 4, 5], step=1)
    request.output_token_ids.append(3)
    request.done = True
    assert shadows.resolve([request]) == (0, 0) and not shadows.open
    shadows.forget("a")
    assert shadows.counts_of("a") == (0, 0) and "a" not in shadows.last


def test_one_shadow_at_a_time_and_at_most_one_every_few_steps() -> None:
    shadows, request = ShadowDrafts(), FakeRequest("a")
    assert shadows.due(request, 1)
    shadows.record(request, [3], step=1)
    request.output_token_ids.append(3)
    assert not shadows.due(request, 1 + SHADOW_EVERY)  # still open
    shadows.resolve([request])
    assert not shadows.due(request, SHADOW_EVERY) and shadows.due(request, 1 + SHADOW_EVERY)
    shadows.record(request, [], step=1 + SHADOW_EVERY)  # nothing found: no shadow, but the step counts
    assert not shadows.open and not shadows.due(request, SHADOW_EVERY + 2)


def test_a_shadow_that_gains_nothing_doubles_the_period_and_one_that_pays_resets_it() -> None:
    """No drafts found, or a first draft that is wrong: the next shadow comes twice as late, up to
    ``SHADOW_MAX``; a draft accepted: ``SHADOW_EVERY`` again. ``forget`` drops the period."""
    shadows, request = ShadowDrafts(), FakeRequest("a", [5])
    assert shadows.due_step("a") is None and shadows.due(request, 0)
    step, periods = 0, []
    for drafts, next_token in [([], None), ([9], 1), ([], None), ([2], 2), ([3], 4), ([], None), ([], None)]:
        shadows.record(request, drafts, step)
        if next_token is not None:
            request.output_token_ids.append(next_token)
            shadows.resolve([request])
        due = shadows.due_step("a")
        assert due is not None
        periods.append(due - step)
        assert not shadows.due(request, due - 1) and shadows.due(request, due)
        step = due
    assert periods == [8, 16, 16, SHADOW_EVERY, 8, 16, 16]
    assert SHADOW_MAX == 16
    shadows.forget("a")
    assert shadows.due_step("a") is None and "a" not in shadows.period


def test_shadow_counts_join_the_requests_acceptance() -> None:
    """Drafting measured at 1.2 plain steps for K rows, an engine whose drafts were mostly rejected (5 of
    100): a new request's estimate starts there and plain decoding is chosen; with 36 of 40 of its
    shadows accepted its estimate is 0.72 and K is chosen (the negative control is the same request
    without them)."""
    policy = AdaptiveDraftLength(K)
    for _ in range(MIN_SAMPLES):
        policy.observe(1, 0, 1.0, [0], 0)
    policy.observe(1, K, 1.2, [K], 0)
    policy.observe(1, K, 1.2, [100 - K], 5)
    policy.shadows.counts["r"] = (40, 36)
    assert policy.acceptance_of(0, 0) == pytest.approx(6 / 102)
    assert policy.acceptance_of(0, 0, "r") == pytest.approx((36 + 8 * 6 / 102) / 48)
    assert policy.choose(1, [policy.acceptance_of(0, 0)]) == 0
    assert policy.choose(1, [policy.acceptance_of(0, 0, "r")]) == K


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    from spec_backend.tools.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("shadow"), "llama")


Shadow = tuple[str, int, tuple[int, ...], list[int]]  # request id, its token count then, drafts, its tokens


def _plain_only(llm: LLM) -> tuple[list[Shadow], list[tuple[int, int]]]:
    """Adaptive drafting that always chooses plain decoding; each shadow recorded and each resolution's
    counts."""
    adaptive: Any = llm.engine.adaptive

    def choose(batch: int, acceptances: Any, mixed: bool = False) -> int:
        adaptive.steps += 1
        return 0

    adaptive.choose = choose
    shadows: list[Shadow] = []
    resolved: list[tuple[int, int]] = []
    record, resolve = adaptive.shadows.record, adaptive.shadows.resolve

    def recorded(request: Any, drafts: Any, step: int) -> None:
        shadows.append(
            (request.request_id, len(request.output_token_ids), tuple(drafts), request.output_token_ids)
        )
        record(request, drafts, step)

    def resolving(requests: Any) -> tuple[int, int]:
        counts: tuple[int, int] = resolve(requests)
        resolved.append(counts)
        return counts

    adaptive.shadows.record, adaptive.shadows.resolve = recorded, resolving
    return shadows, resolved


def test_shadows_count_what_a_verify_step_would_have_accepted(target: str) -> None:
    """Plain decoding throughout: shadows of the n-gram lookup (the drafts a fresh proposer finds over the
    request's tokens then), each ``SHADOW_EVERY`` steps after one that accepted a draft and twice the
    period before (up to ``SHADOW_MAX``) after one that found nothing or whose first draft was wrong; the
    accepted counts summed over those decided before the last step are the common prefixes of each shadow
    with the tokens that followed."""
    llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE_NGRAM)
    shadows, resolved = _plain_only(llm)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    out = llm.generate([PROMPTS[0]], params)[0].outputs[0].token_ids
    plain = LLM(target, dtype="float64").generate([PROMPTS[0]], params)[0].outputs[0].token_ids
    assert out == plain
    assert len(shadows) >= 40 // (2 * SHADOW_MAX)
    drafted = accepted = 0
    period, paid = SHADOW_EVERY, []
    nexts = [after for _, after, _, _ in shadows[1:]] + [0]  # each shadow's next one's token count
    for (_, start, drafts, tokens), after in zip(shadows, nexts, strict=True):
        fresh = build_ngram_proposer(llm.speculative_config)  # type: ignore[arg-type]
        fresh.add_request("r", [*PROMPTS[0], *tokens[:start]])
        budget = min(K, len(out) - start - 1)  # a step emits at most what is left of max_tokens
        assert list(drafts) == fresh.propose(["r"], max_tokens=[budget])[0]
        seen = out[start : min(start + len(drafts), len(out) - 1)]  # the last step resolves nothing
        matched = next((j for j, (d, t) in enumerate(zip(drafts, seen, strict=False)) if d != t), len(seen))
        if matched < len(seen) or len(seen) == len(drafts):
            drafted, accepted = drafted + len(drafts), accepted + matched
        # plain decoding of one request: a token a step; every shadow (K <= its period) is decided by
        # the date of the next
        period = SHADOW_EVERY if matched else min(2 * period, SHADOW_MAX)
        paid.append(matched > 0)
        assert after == 0 or after - start == period, (start, after, period)
    assert (sum(d for d, _ in resolved), sum(a for _, a in resolved)) == (drafted, accepted)
    assert drafted > 0 and accepted > 0  # the comparison saw drafts, some accepted
    assert True in paid and False in paid  # both rules of the period were exercised


def test_without_adaptive_drafting_or_with_speculation_off_nothing_is_shadowed(target: str) -> None:
    """Negative controls: no shadow without the option, none while speculation is off."""
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    fixed = LLM(
        target, dtype="float64", speculative_config={**ADAPTIVE_NGRAM, "adaptive_draft_length": False}
    )
    assert fixed.engine.shadow_budgets(list(fixed.engine.running)) is None
    llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE_NGRAM)
    shadows, _ = _plain_only(llm)
    llm.set_speculation(False)
    llm.generate([PROMPTS[0]], params)
    assert shadows == []
    llm.set_speculation(True)
    llm.generate([PROMPTS[0]], params)
    assert shadows


def test_sampled_requests_are_not_shadowed(target: str) -> None:
    """A sampled request keeps K (its drafts are verified, and no step beside it is idle); the greedy
    request is shadowed once alone."""
    llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE_NGRAM)
    shadows, _ = _plain_only(llm)
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=3, max_tokens=6, ignore_eos=True),
    ]
    outputs = llm.generate(PROMPTS[:2], params)
    assert shadows and {request_id for request_id, *_ in shadows} == {outputs[0].request_id}
