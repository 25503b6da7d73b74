"""Adaptive draft length in the engine (``speculative_config["adaptive_draft_length"]``,
``engine/adaptive.py``): on by default for chains, greedy output unchanged, speculation turned off where
drafts cost more than they give and kept where they pay, re-measurements timed, sampled requests always at
K and the greedy requests beside them too. The policy alone: ``test_adaptive_draft_length.py``."""

from __future__ import annotations

from typing import Any

import pytest
from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - autouse

from spec_backend.config.speculative import SpeculativeConfig
from spec_backend.engine import LLM, SamplingParams
from spec_backend.engine.adaptive import EXPLORE_EVERY, MIN_SAMPLES
from spec_backend.engine.assembly import adaptive_wanted
from spec_backend.proposers.contract import DraftOutput
from spec_backend.tools.tiny import make_tiny_model

K = 4


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("adaptive"), "llama")


class StepClock:
    """The policy's clock in these tests, so the choices do not depend on the machine's load: each read
    advances half a second (a step's two reads are 0.5 s apart: its fixed cost), and each draft budgeted
    to a proposal within the step adds ``draft_cost`` (``charge``)."""

    def __init__(self, draft_cost: float) -> None:
        self.now, self.draft_cost = 0.0, draft_cost

    def __call__(self) -> float:
        self.now += 0.5
        return self.now

    def charge(self, budgets: tuple[int, ...]) -> None:
        self.now += self.draft_cost * max(budgets, default=0)


def _charged(llm: LLM, draft_cost: float, wrong: bool) -> None:
    """Proposals advance the engine's step clock by ``draft_cost`` per draft; ``wrong``: every draft id is
    shifted by one (a shadow's too: shadows cost a lookup, nothing on this clock), so drafts cost and
    never pay. The start-up profile (``cost_profile``) was timed on the real clock: the policy starts
    without it and measures on this one."""
    adaptive = llm.engine.adaptive
    clock = StepClock(draft_cost)
    if adaptive is not None:
        adaptive.clock, adaptive.profile = clock, {}
    drafter: Any = llm.engine.drafter
    propose, shadow = drafter.propose, drafter.shadow

    def shadowed(inputs: Any) -> Any:
        got = shadow(inputs)
        if got is None or not wrong:
            return got
        drafts = [
            [(t + 1) % 128 for t in d] + [0] * (b - len(d))
            for d, b in zip(got[0], inputs.budgets, strict=True)
        ]
        return drafts, got[1]

    drafter.shadow = shadowed

    def charged(inputs: Any) -> DraftOutput:
        out: DraftOutput = propose(inputs)
        clock.charge(tuple(inputs.budgets))
        if not wrong:
            return out
        shifted = (out.token_ids + 1).remainder(128)  # [B, K]
        return DraftOutput(shifted, tuple(inputs.budgets), out.draft_probs, out.errors)

    drafter.propose = charged


#: ngram with adaptive drafting, every suffix of one token or more looked up
ADAPTIVE_NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": K,
    "prompt_lookup_min": 1,
    "adaptive_draft_length": True,
}


#: an engine's first choices: plain decoding, then K, each one step more than ``MIN_SAMPLES`` (the step that
#: switches verifies the drafts planned at the length before, so it is not a sample)
MEASURED = [0] * (MIN_SAMPLES + 1) + [K] * (MIN_SAMPLES + 1)


def _costly_adaptive_ngram(target: str) -> LLM:
    """An adaptive ngram engine whose drafts cost 0.2 of a step each and are never accepted."""
    llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE_NGRAM)
    _charged(llm, 0.2, wrong=True)
    return llm


def test_drafts_that_cost_and_never_pay_are_turned_off_for_greedy_requests(target: str) -> None:
    llm = _costly_adaptive_ngram(target)
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    got = llm.generate([PROMPTS[0]], params)[0].outputs[0].token_ids
    plain = LLM(target, dtype="float64").generate([PROMPTS[0]], params)[0].outputs[0].token_ids
    assert got == plain  # greedy: the output does not depend on the draft length
    adaptive = llm.engine.adaptive
    # plain decoding first, then K while the n-gram's shadows say it could pay (the first step of each
    # verifies the length before it: no sample); the verified drafts refute it before it is timed twice
    assert adaptive is not None and adaptive.chosen[: MIN_SAMPLES + 1] == [0] * (MIN_SAMPLES + 1)
    assert 0 < adaptive.chosen.count(K) <= MIN_SAMPLES + 1, adaptive.chosen
    assert sum(1 for k in adaptive.chosen[-20:] if k) <= 1  # off, but for one measurement


def test_drafting_is_not_timed_before_shadows_say_it_could_pay(target: str) -> None:
    """A drafter that shadows, with drafts that never pay: once a shadow is decided the acceptance says
    drafting would not pay even at no cost, and K is never verified just to time it (each such step cost
    ~1.5 plain steps on open chat). A drafter that cannot shadow still times K first (the next test)."""
    llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE_NGRAM)
    _charged(llm, 0.2, wrong=True)
    adaptive = llm.engine.adaptive
    assert adaptive is not None and adaptive.shadowed
    adaptive.drafted, adaptive.accepted = 200, 0  # an engine whose drafts were refuted so far
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    assert set(adaptive.chosen) == {0}
    assert llm.metrics.total.num_drafts == 1  # the prefill's, planned at K before any choice
    assert adaptive.batches[1].samples == 0  # drafting never timed


def _self_drafting(target: str) -> LLM:
    """The target drafting for itself (a draft model: it cannot shadow), with adaptive drafting."""
    spec = {
        "method": "draft_model",
        "model": target,
        "num_speculative_tokens": K,
        "adaptive_draft_length": True,
    }
    return LLM(target, dtype="float64", speculative_config=spec)


def test_re_measurements_are_measured(target: str) -> None:
    """The extreme not chosen is timed again in an engine, and those steps are samples (a one-step
    re-measurement once never was). A draft model cannot shadow, so its acceptance stands still while
    plain decoding is chosen and only re-measurements can see drafts start paying: with drafts that
    cost and never pay, K is re-measured after ``EXPLORE_EVERY`` steps (the first measurement alone takes
    it ``MIN_SAMPLES + 1`` times)."""
    llm = _self_drafting(target)
    _charged(llm, 0.2, wrong=True)
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=3 * EXPLORE_EVERY, ignore_eos=True))
    adaptive = llm.engine.adaptive
    assert adaptive is not None and adaptive.chosen.count(K) > MIN_SAMPLES + 1  # it was re-measured ...
    assert adaptive.batches[1].samples > MIN_SAMPLES + 1  # ... and those steps were samples


def test_on_by_default_for_chains_and_off_where_asked(target: str) -> None:
    """``adaptive_draft_length`` unset: on for an n-gram chain, off for synthetic acceptance (a benchmark
    of a drafter at a set acceptance and K); set, as set."""
    ngram = {"method": "ngram", "num_speculative_tokens": K}
    assert LLM(target, speculative_config=ngram).engine.adaptive is not None
    assert LLM(target, speculative_config={**ngram, "adaptive_draft_length": False}).engine.adaptive is None
    synthetic = {**ngram, "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.0}
    assert LLM(target, speculative_config=synthetic).engine.adaptive is None
    on = {**synthetic, "adaptive_draft_length": True}
    assert LLM(target, speculative_config=on).engine.adaptive is not None


@pytest.mark.parametrize(
    ("setting", "tree", "confidence", "wanted"),
    [
        (None, False, False, True),
        (None, True, False, False),  # a tree: the policy prices a chain's rows
        (None, False, True, False),  # a confidence rule chooses verify lengths itself
        (True, True, False, True),
        (True, False, True, True),  # the engine then keeps the confidence rule alone (logged)
        (False, False, False, False),
    ],
)
def test_adaptive_wanted(setting: bool | None, tree: bool, confidence: bool, wanted: bool) -> None:
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=K, adaptive_draft_length=setting)
    assert adaptive_wanted(spec, tree, confidence) is wanted


def test_without_the_option_drafting_goes_on(target: str) -> None:
    """Negative control: the same costly drafter, adaptive off: every step drafts K."""
    spec = {"method": "ngram", "num_speculative_tokens": K, "adaptive_draft_length": False}
    llm = LLM(target, dtype="float64", speculative_config=spec)
    _charged(llm, 0.2, wrong=True)
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    assert llm.engine.adaptive is None
    assert llm.metrics.total.num_drafts >= 18


def test_drafts_that_pay_are_kept(target: str) -> None:
    """The target drafting for itself: every draft is accepted, so the longest length stays."""
    llm = _self_drafting(target)
    _charged(llm, 0.05, wrong=False)  # a step with K drafts takes 1.2 times one without
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True))
    adaptive = llm.engine.adaptive
    assert adaptive is not None and adaptive.chosen[: len(MEASURED)] == MEASURED
    assert set(adaptive.chosen[len(MEASURED) :]) == {K}, adaptive.chosen


def test_sampled_requests_keep_k(target: str) -> None:
    """Beside greedy requests whose drafts are turned off, a sampled request is budgeted K every step,
    and its seeded tokens are those of the same engine without the option."""
    spec = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1}
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=5, max_tokens=40, ignore_eos=True),
    ]
    outputs = []
    for adaptive in (False, True):
        llm = LLM(target, dtype="float64", speculative_config={**spec, "adaptive_draft_length": adaptive})
        _charged(llm, 0.2, wrong=True)
        budgets: list[tuple[int, ...]] = []
        drafter: Any = llm.engine.drafter
        propose = drafter.propose

        def spy(inputs: Any, propose: Any = propose, budgets: list[tuple[int, ...]] = budgets) -> Any:
            budgets.append(tuple(inputs.budgets))
            return propose(inputs)

        drafter.propose = spy
        outputs.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], params)])
        assert all(b[1] == K for b in budgets[1:30])  # the sampled request (slot 1), far from its end
    assert outputs[0][1] == outputs[1][1]


def test_steps_without_speculation_are_no_samples(target: str) -> None:
    """``set_speculation(False)`` (or ``disable_by_batch_size``): the steps draft nothing and, on a graph
    engine, replay the one-token step; recorded under the last planned length, they corrupted its time and
    drafts (failed before: 7 samples)."""
    llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE_NGRAM)
    llm.set_speculation(False)
    llm.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=8))
    adaptive = llm.engine.adaptive
    assert adaptive is not None and adaptive.batches == {}
    llm.set_speculation(True)  # negative control: speculative steps are samples
    llm.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=8))
    assert sum(b.samples + b.plain for b in adaptive.batches.values()) > 0


def test_greedy_requests_beside_a_sampled_one_keep_k(target: str) -> None:
    """The target drafting for itself (every draft accepted) for a greedy and a sampled request: the
    greedy one is budgeted K every step far from its end (failed before: 0 for good, as no step of the
    batch verified no draft)."""
    llm = _self_drafting(target)
    budgets: list[tuple[int, ...]] = []
    drafter: Any = llm.engine.drafter
    propose = drafter.propose

    def spy(inputs: Any) -> Any:
        budgets.append(tuple(inputs.budgets))
        return propose(inputs)

    drafter.propose = spy
    params = [
        SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=1, max_tokens=60, ignore_eos=True),
    ]
    llm.generate(PROMPTS[:2], params)
    assert all(b[0] == K for b in budgets[1:8] if len(b) == 2)
