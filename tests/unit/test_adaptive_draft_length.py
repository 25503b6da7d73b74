"""Adaptive draft length (``speculative_config["adaptive_draft_length"]``, ``engine/adaptive.py``): the
expected-tokens formula and the policy's choices on given times and acceptances. In the engine:
``test_adaptive_engine.py``."""

from __future__ import annotations

import pytest
from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - autouse

from spec_backend.config import SpeculativeConfig
from spec_backend.engine.adaptive import (
    CHOSEN_KEPT,
    EXPLORE_EVERY,
    EXPLORE_HOLD,
    MARGIN,
    MIN_SAMPLES,
    REFERENCE_AGE,
    AdaptiveDraftLength,
    expected_tokens,
    reach_of,
    reached_tokens,
)

K = 4


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, K) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert expected_tokens(1.0, K) == K + 1
    assert expected_tokens(0.8, 0) == 1.0


def _measured(policy: AdaptiveDraftLength, batch: int, cost: float, drafts: int = K) -> None:
    """Plain steps of 1 s, then steps at ``K`` of ``cost`` seconds in which every request verified
    ``drafts`` drafts (``K`` unless given: the drafter filled its budget); acceptance is left to
    ``acceptance_of``."""
    for _ in range(MIN_SAMPLES):
        policy.observe(batch, 0, 1.0, [0] * batch, 0)
    for _ in range(MIN_SAMPLES):
        policy.observe(batch, K, cost, [drafts] * batch, 0)


def test_both_extremes_are_measured_first() -> None:
    """Plain decoding first, then ``K``: a drafting step's time is a ratio to the plain steps before it;
    K draft rows taking 1.5 plain steps make each row cost 0.5 / K of one."""
    policy = AdaptiveDraftLength(K)
    for _ in range(MIN_SAMPLES):
        assert policy.choose(1, [0.5]) == 0
        policy.observe(1, 0, 2.0, [0], 0)
    for _ in range(MIN_SAMPLES):
        assert policy.choose(1, [0.5]) == K
        policy.observe(1, K, 3.0, [K], 0)
    measured = policy.batches[1]
    assert measured.samples == MIN_SAMPLES and measured.slope == pytest.approx(0.5 / K)
    assert policy.cost(1, K) == pytest.approx(1.5) and policy.cost(1, 2) == pytest.approx(1.25)
    assert policy.choose(3, [0.5]) == 0  # another batch size is measured on its own


def test_a_step_whose_drafter_proposed_nothing_costs_a_plain_step() -> None:
    """An eager step computes the rows it verifies: under a budget of K with no proposal it is a plain
    step (it refreshes the reference and is no sample of the drafts' cost), and the cost of K falls with
    the share of requests that get drafts. Before, a length's time was the mean of its steps with and
    without drafts, whatever share of them had drafts now."""
    policy = AdaptiveDraftLength(K)
    _measured(policy, 1, 2.0)
    assert policy.cost(1, K) == pytest.approx(2.0)
    for _ in range(8):
        policy.observe(1, K, 1.0, [0], 0)
    measured = policy.batches[1]
    assert measured.plain == MIN_SAMPLES + 8 and measured.samples == MIN_SAMPLES
    assert measured.reach[0] == pytest.approx(0.75**8)
    assert policy.cost(1, K) == pytest.approx(1.0 + 0.25 * K * 0.75**8)


def _drifting(
    policy: AdaptiveDraftLength, steps: int, ratios: dict[int, float], acceptance: float
) -> list[int]:
    """``steps`` choose-and-observe rounds on a machine whose plain step grows from 1 s by 2 % a step (a
    growing context, a load coming on); a step at ``k`` takes ``ratios[k]`` (``k`` in 0 and ``K``,
    linear between) times it, and its requests verify ``k`` drafts. The choices."""
    for step in range(steps):
        k = policy.choose(1, [acceptance])
        ratio = 1.0 + (ratios[K] - 1.0) * k / K
        policy.observe(1, k, (1.0 + 0.02 * step) * ratio, [k], 0)
    return policy.chosen


@pytest.mark.parametrize(("ratio", "drafting"), [(1.2, True), (3.0, False)])
def test_lengths_are_timed_against_plain_steps_of_the_same_moment(ratio: float, drafting: bool) -> None:
    """Drafts accepted at 0.6 (K of them emit 2.31 tokens a step): at 1.2 plain steps per K step, long
    drafts pay 1.9x (3 and K within 2 % of each other) and are kept while the plain step's time grows
    fourfold; at 3.0 (negative control) drafting never pays. Failed before, when each length kept its
    absolute time from whenever it was last measured: the drift made lengths measured earlier look
    cheaper, and the choice wandered over 1..K (3 or K in 73 % of the steps where they pay; some drafting
    in 69 % of those where none pays)."""
    chosen = _drifting(AdaptiveDraftLength(K), 160, {0: 1.0, K: ratio}, 0.6)
    late = chosen[20:]
    if drafting:
        assert sum(1 for k in late if k >= 3) / len(late) > 0.9
    else:
        assert sum(1 for k in late if k) / len(late) < 0.1


def test_a_drafting_step_long_after_the_last_plain_step_is_no_sample() -> None:
    """Its time is compared with nothing as recent (``REFERENCE_AGE`` steps): a plain step then would
    have been slower or faster by the drift since."""
    policy = AdaptiveDraftLength(K)
    _measured(policy, 1, 1.2)
    for _ in range(REFERENCE_AGE + 1):
        policy.choose(1, [0.6])
    policy.observe(1, K, 9.0, [K], 0)
    measured = policy.batches[1]
    assert measured.samples == MIN_SAMPLES and measured.slope == pytest.approx(0.2 / K)
    policy.observe(1, 0, 1.0, [0], 0)  # negative control: after a plain step, it is
    policy.observe(1, K, 9.0, [K], 0)
    assert measured.samples == MIN_SAMPLES + 1 and measured.slope > 0.2 / K


@pytest.mark.parametrize(
    ("acceptance", "cost", "best"),
    [
        (0.9, 1.2, K),  # cheap verify rows, drafts accepted: the longest
        (0.0, 1.2, 0),  # nothing accepted: plain decoding
        (0.9, 3.0, 3),  # half a plain step a row: 3.44 tokens in 2.5 beat 4.10 in 3.0 and 2.71 in 2.0
    ],
)
def test_the_length_with_the_most_tokens_per_second(acceptance: float, cost: float, best: int) -> None:
    policy = AdaptiveDraftLength(K)
    _measured(policy, 1, cost)
    assert policy.choose(1, [acceptance]) == best


def test_a_budget_the_drafter_does_not_fill_is_valued_at_the_drafts_it_gets() -> None:
    """Steps at K verify one draft per request (a suffix or n-gram drafter finding little to copy) and
    take 1.3 plain steps: K drafts would be worth 2.31 tokens at acceptance 0.6, the one that comes 1.6,
    which is what every budget of 1 or more is valued at (the first of them is chosen). Negative control:
    the same time with full budgets makes a row cost 0.075 and chooses 3. Failed before: lengths were
    valued at their budget."""
    short, full = AdaptiveDraftLength(K), AdaptiveDraftLength(K)
    _measured(short, 1, 1.3, drafts=1)
    _measured(full, 1, 1.3)
    assert short.choose(1, [0.6]) == 1
    assert full.choose(1, [0.6]) == 3
    assert short.rate(1, K, [0.6]) == pytest.approx(expected_tokens(0.6, 1) / 1.3)


def test_drafts_are_valued_by_how_often_each_one_comes_not_by_their_mean() -> None:
    """Steps at K where one request in four verifies K drafts and the others none (a suffix drafter
    that finds a match now and then) have a mean of one draft per request, like steps where every request
    verifies one; both take 1.5 plain steps, so a draft row per request costs 0.5. At acceptance 0.6 the
    first are worth 1 + 0.6 / 4 = 1.15 tokens a step at k = 1 for 1.125 plain steps (2 % faster: inside
    the margin) and 1.33 at K for 1.5, the second 1.6 at every k >= 1 for 1.5 (7 % faster): the first
    chooses plain decoding, the second k = 1 (negative control). Failed before: the mean alone (1.6 for
    both) chose k = 1 for both."""
    rare, steady = AdaptiveDraftLength(K), AdaptiveDraftLength(K)
    for policy, drafts in ((rare, [K, 0, 0, 0]), (steady, [1, 1, 1, 1])):
        for _ in range(MIN_SAMPLES):
            policy.observe(4, 0, 1.0, [0] * 4, 0)
            policy.observe(4, K, 1.5, drafts, 0)
    assert sum(rare.batches[4].reach) == sum(steady.batches[4].reach) == 1.0  # drafts per request
    assert rare.choose(4, [0.6] * 4) == 0
    assert steady.choose(4, [0.6] * 4) == 1
    assert rare.rate(4, 1, [0.6]) == pytest.approx(1.15 / 1.125)
    assert reach_of([K, 0, 0, 0], K) == [0.25] * K
    assert reached_tokens(0.6, [0.25] * K)[-1] == pytest.approx(1 + 0.25 * (0.6 + 0.36 + 0.216 + 0.1296))
    assert reached_tokens(0.6, [1.0, 1.0]) == pytest.approx([expected_tokens(0.6, k) for k in range(3)])


@pytest.mark.parametrize(("gain", "best"), [(1.03, 0), (1.08, 1)])
def test_drafting_must_beat_plain_decoding_by_the_margin(gain: float, best: int) -> None:
    """One draft per request at acceptance 0.5 emits 1.5 tokens a step; with that draft's row measured
    to cost 1.5 / ``gain`` of a plain step, drafting is predicted ``gain`` times faster: chosen only above
    ``MARGIN`` (a 3 % gain is inside the noise of the times it is predicted from; 8 % is not)."""
    policy = AdaptiveDraftLength(K)
    _measured(policy, 1, 1.5 / gain, drafts=1)
    assert policy.rate(1, 1, [0.5]) / policy.rate(1, 0, [0.5]) == pytest.approx(gain)
    assert (gain < MARGIN) == (best == 0)
    assert policy.choose(1, [0.5]) == best


def test_the_extreme_not_chosen_is_measured_again_ever_less_often_while_it_changes_nothing() -> None:
    """After ``EXPLORE_EVERY`` steps, for ``EXPLORE_HOLD`` consecutive steps (one is never a sample); then
    twice as long after each re-measurement that left the choice as it was. Failed before: every
    ``EXPLORE_EVERY`` steps, ~5 % of open chat's steps verifying K drafts for nothing."""
    policy = AdaptiveDraftLength(K)
    _measured(policy, 1, 9.0)
    choices = [policy.choose(1, [0.1]) for _ in range(400)]
    explored = [step + 1 for step, k in enumerate(choices) if k == K]
    starts, hold, start, period = [], list(range(EXPLORE_HOLD)), EXPLORE_EVERY, EXPLORE_EVERY
    while start + EXPLORE_HOLD <= 400:
        starts.append(start)
        period *= 2
        start += EXPLORE_HOLD + period
    assert starts == [32, 99, 230]
    assert explored == [s + h for s in starts for h in hold]


@pytest.mark.parametrize(
    ("acceptance", "shadowed", "explored"), [(0.01, True, False), (0.1, True, True), (0.01, False, True)]
)
def test_no_re_measurement_when_drafts_would_not_pay_even_for_free(
    acceptance: float, shadowed: bool, explored: bool
) -> None:
    """At acceptance 0.01, K drafts emit 1.01 tokens a step: below the margin whatever a draft row costs,
    so timing K again cannot change the choice and it is not done (before, 3 steps in every period
    verified K drafts for nothing); at 0.1 (1.11 tokens, negative control) it is, as above. Only while
    shadows keep the acceptance measured: without them it stands still while nothing is verified, and a
    re-measurement is the only way to see drafts start paying (negative control)."""
    policy = AdaptiveDraftLength(K)
    _measured(policy, 1, 9.0)
    choices = []
    for _ in range(400):
        choices.append(policy.choose(1, [acceptance]))
        if shadowed:
            policy.observe_shadows(1, [], [])
    assert (K in choices) == explored


def _explore_unchanged(policy: AdaptiveDraftLength, batch: int = 1) -> None:
    """Steps at plain decoding up to and through one re-measurement that leaves the choice as it was."""
    while True:
        k = policy.choose(batch, [0.1])
        assert k in (0, K)
        policy.observe(batch, k, 1.0 if k == 0 else 9.0, [k] * batch, 0)
        if policy.explored_from is None and k == 0 and policy.chosen[-2:-1] == [K]:
            return


def _plain_step(policy: AdaptiveDraftLength, batch: int = 1, acceptance: float = 0.1) -> None:
    """A step that chooses plain decoding, timed at 1 s."""
    assert policy.choose(batch, [acceptance] * batch) == 0
    policy.observe(batch, 0, 1.0, [0] * batch, 0)


@pytest.mark.parametrize("timed_at", [EXPLORE_EVERY - 3, None], ids=["timed-just-before", "never-since"])
def test_a_re_measurement_waits_a_period_after_its_extreme_was_last_timed(timed_at: int | None) -> None:
    """Drafting was timed three steps before a re-measurement fell due (as when shadows say drafts could
    pay): timing it again at once learns nothing and verifies K drafts for nothing (seen on open chat:
    three more steps at K right after six). It starts a period after that timing. Failed before: it
    started when due. Negative control: drafting not timed since the start is re-measured when due."""
    policy = AdaptiveDraftLength(K)
    _measured(policy, 1, 9.0)
    policy.steps = 1  # the start's samples were timed at step 0
    choices = []
    while policy.steps < 3 * EXPLORE_EVERY:
        if policy.steps == timed_at:
            policy.observe(1, K, 9.0, [K], 0)  # a drafting step timed against the plain steps before it
        choices.append(policy.choose(1, [0.1]))
        policy.observe(1, choices[-1], 1.0 if choices[-1] == 0 else 9.0, [choices[-1]], 0)
    start = EXPLORE_EVERY if timed_at is None else timed_at + EXPLORE_EVERY
    assert [s + 2 for s, k in enumerate(choices) if k == K][:EXPLORE_HOLD] == list(
        range(start, start + EXPLORE_HOLD)
    )


def test_a_re_measurement_that_changes_the_choice_resets_the_period() -> None:
    """Two re-measurements that change nothing double the period twice (128); then drafting has become
    cheap (the load fell): the third finds K faster, chooses it, and the period is ``EXPLORE_EVERY``
    again. Keeping the period instead of resetting it fails this."""
    policy = AdaptiveDraftLength(K)
    _measured(policy, 1, 9.0)
    _explore_unchanged(policy)
    _explore_unchanged(policy)
    assert policy.period == 4 * EXPLORE_EVERY
    while policy.steps + 1 < policy.next_explore:
        _plain_step(policy, acceptance=0.9)
    for _ in range(EXPLORE_HOLD):
        assert policy.choose(1, [0.9]) == K
        policy.observe(1, K, 0.1, [K], 0)  # K drafts now cost less than a plain step did
    assert policy.choose(1, [0.9]) != 0 and policy.period == EXPLORE_EVERY
    assert policy.next_explore == policy.steps + EXPLORE_EVERY


def test_a_re_measurement_across_batch_sizes_leaves_the_period() -> None:
    """A request left during the re-measurement: its choice before and after are of different batch
    sizes, so neither a doubling nor a reset follows from comparing them."""
    policy = AdaptiveDraftLength(K)
    _measured(policy, 1, 9.0)
    _measured(policy, 2, 1.0)  # at two requests drafting pays
    _explore_unchanged(policy)
    assert policy.period == 2 * EXPLORE_EVERY
    while policy.explored_from is None:
        policy.choose(1, [0.1])
    while policy.explored_from is not None:
        policy.choose(2, [0.9, 0.9])  # ends choosing K at two requests, from 0 at one
    assert policy.chosen[-1] != 0 and policy.period == 2 * EXPLORE_EVERY


def test_a_captured_verify_step_costs_the_same_for_every_draft_length() -> None:
    """With ``fixed_width`` (a captured K+1-token verify graph) a step with one draft costs what one with K
    does, not a share of it: at acceptance 0.35 one draft is worth 1.35 tokens, 1.08x plain at an eager
    step's 1.25 but 0.68x at K's 2.0 — plain decoding is chosen (negative control: rows priced one by one
    choose 1)."""
    flat, sloped = AdaptiveDraftLength(K, fixed_width=True), AdaptiveDraftLength(K)
    for policy in (flat, sloped):
        _measured(policy, 1, 2.0)
    assert flat.choose(1, [0.35]) == 0
    assert sloped.choose(1, [0.35]) == 1
    assert flat.rate(1, 1, [0.35]) == pytest.approx(1.35 / 2.0)


def test_without_greedy_requests_nothing_adapts() -> None:
    policy = AdaptiveDraftLength(K)
    _measured(policy, 1, 9.0)
    assert policy.choose(1, []) == K


def test_a_request_starts_at_the_engines_mean_and_moves_with_its_own_counts() -> None:
    policy = AdaptiveDraftLength(K)
    policy.observe(1, K, 1.0, [100], 80)
    assert policy.acceptance_of(0, 0) == pytest.approx(81 / 102)
    assert policy.acceptance_of(40, 0) < 0.2 < policy.acceptance_of(40, 40)


def test_the_option_is_unset_by_default_and_refuses_non_bools() -> None:
    """Unset: the engine decides (on for chains: ``test_adaptive_engine.py``); a round trip keeps it."""
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=K)
    assert spec.adaptive_draft_length is None
    assert SpeculativeConfig.model_validate(spec.model_dump()) == spec
    with pytest.raises(ValueError, match="adaptive_draft_length"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=K, adaptive_draft_length=[1])  # type: ignore[arg-type]


def test_a_drafting_step_faster_than_plain_makes_rows_free_not_profitable() -> None:
    """Eight requests, one verifying a draft in 0.9 of a plain step (noise, or a step retried request by
    request): the slope reads -0.8 per row, which priced a step with drafts at 0.9 of a plain one and
    chose drafting at acceptance 0. A row's cost is now at least nothing."""
    policy = AdaptiveDraftLength(K)
    for _ in range(MIN_SAMPLES):
        policy.observe(8, 0, 1.0, [0] * 8, 0)
    for _ in range(MIN_SAMPLES):
        policy.observe(8, K, 0.9, [1] + [0] * 7, 0)
    assert policy.batches[8].slope < 0
    assert policy.cost(8, K) == 1.0
    assert policy.choose(8, [0.0] * 8) == 0


def test_a_batch_with_a_sampled_request_keeps_k() -> None:
    """Its sampled request's drafts are verified every step, so no step is a plain one to time drafting
    against: the greedy requests beside it keep K instead of waiting at 0 for a plain step that never
    comes (failed before: 0 for good)."""
    policy = AdaptiveDraftLength(K)
    assert [policy.choose(2, [0.9], mixed=True) for _ in range(10)] == [K] * 10
    assert policy.choose(2, [0.9, 0.9]) == 0  # negative control: all greedy, plain decoding is timed first


def test_the_history_of_choices_is_bounded() -> None:
    """A long-running engine decides every few milliseconds: ``chosen`` keeps the most recent
    ``CHOSEN_KEPT`` to ``2 * CHOSEN_KEPT`` choices, the newest last (before, one entry a step forever)."""
    policy, longest = AdaptiveDraftLength(K), 0
    for _ in range(5 * CHOSEN_KEPT):
        policy.observe(1, 0, 1.0, [0], 0)
        assert policy.choose(1, [0.1]) == policy.chosen[-1]
        longest = max(longest, len(policy.chosen))
    assert longest == 2 * CHOSEN_KEPT and CHOSEN_KEPT <= len(policy.chosen) < 2 * CHOSEN_KEPT
    policy.hold_until, policy.hold_ids = policy.steps + 3, ()
    assert policy.held([]) and policy.chosen[-1] == 0 and policy.steps == 5 * CHOSEN_KEPT + 1
