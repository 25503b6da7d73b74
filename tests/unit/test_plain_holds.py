"""Held plain steps (``AdaptiveDraftLength.hold``, ``EngineCore.holds_plain``): a decode step that drafts for
no request skips the policy and a drafter that ``defers_follow``, which is handed the held steps' tokens at
its next call. Held steps choose what deciding every step would, the drafter ends with every token in
order, and a suffix proposer caches whole responses."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - autouse
from test_adaptive_engine import ADAPTIVE_NGRAM, K, _charged

from spec_backend.engine import LLM, SamplingParams
from spec_backend.engine.adaptive import MIN_SAMPLES, AdaptiveDraftLength
from spec_backend.engine.shadow_drafts import SHADOW_EVERY
from spec_backend.proposers.contract import DraftOutput
from spec_backend.tools.tiny import make_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("holds"), "llama")


def _calls(llm: LLM) -> dict[str, int]:
    """Count the drafter's calls by name (``follow``, ``shadow``, ``propose``, ``take_tokens``)."""
    drafter: Any = llm.engine.drafter
    counts = dict.fromkeys(("follow", "shadow", "propose", "take_tokens"), 0)
    for name in counts:
        method = getattr(drafter, name)

        def counted(*args: Any, _name: str = name, _method: Any = method) -> Any:
            counts[_name] += 1
            return _method(*args)

        setattr(drafter, name, counted)
    return counts


def _updates(llm: LLM) -> dict[str, list[int]]:
    """Every token the host proposer is given after a request's prompt, by request id, in order."""
    proposer: Any = llm.engine.drafter.proposer  # type: ignore[union-attr]
    seen: dict[str, list[int]] = {}
    update = proposer.update

    def recorded(request_id: str, tokens: Any) -> None:
        seen.setdefault(request_id, []).extend(int(t) for t in tokens)
        update(request_id, tokens)

    proposer.update = recorded
    return seen


def _wrong_until(llm: LLM, tokens: int) -> None:
    """Drafts (and shadows) for a request are shifted by one, so never accepted, until it has ``tokens``
    output tokens; from then on they are the n-gram lookup's (the tiny model's greedy text repeats, so
    most are accepted): a chat turning into a code edit."""
    drafter: Any = llm.engine.drafter
    propose, shadow = drafter.propose, drafter.shadow

    def spoiled(inputs: Any) -> list[bool]:
        return [len(r.output_token_ids) < tokens for r in inputs.requests]

    def shadowed(inputs: Any) -> Any:
        got = shadow(inputs)
        if got is None:
            return got
        marks = spoiled(inputs)
        drafts = [[(t + 1) % 128 if s else t for t in d] for d, s in zip(got[0], marks, strict=True)]
        return drafts, got[1]

    def proposed(inputs: Any) -> DraftOutput:
        out: DraftOutput = propose(inputs)
        shift = torch.tensor(spoiled(inputs), dtype=torch.int64)[:, None]  # [B, 1]
        ids = torch.where(out.token_ids >= 0, (out.token_ids + shift).remainder(128), out.token_ids)
        return DraftOutput(ids, out.num_draft_tokens, out.draft_probs, out.errors)

    drafter.shadow, drafter.propose = shadowed, proposed


@pytest.mark.parametrize("turning", [False, True], ids=["drafts-never-pay", "drafts-start-paying"])
def test_held_steps_choose_what_deciding_every_step_chooses(target: str, turning: bool) -> None:
    """Two adaptive n-gram engines on the policy's step clock, one deciding every step (its drafter
    marked as not deferring: the negative control, which holds nothing): the same draft length at every
    step, the same shadows' counts, the same tokens, and fewer drafter calls where steps were held. With
    drafts that start paying part-way, a shadow that accepts ends a hold and drafting is chosen again."""
    runs = []
    for defers in (True, False):
        llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE_NGRAM)
        _charged(llm, 0.2, wrong=not turning)
        if turning:
            _wrong_until(llm, 40)
        drafter: Any = llm.engine.drafter
        drafter.defers_follow = defers
        calls, held = _calls(llm), []
        holds = llm.engine.holds_plain

        def recorded(requests: Any, _holds: Any = holds, _held: list[bool] = held) -> bool:
            _held.append(_holds(requests))
            return _held[-1]

        llm.engine.holds_plain = recorded  # type: ignore[method-assign]
        outputs = llm.generate(PROMPTS[:2], [GREEDY, SamplingParams(temperature=0.0, max_tokens=40)])
        adaptive = llm.engine.adaptive
        assert adaptive is not None
        counts = (adaptive.drafted, adaptive.accepted, dict(adaptive.shadows.counts))
        runs.append(([o.outputs[0].token_ids for o in outputs], adaptive.chosen, counts, calls, held))
    (tokens, chosen, counts, calls, held), (tokens0, chosen0, counts0, calls0, held0) = runs
    assert tokens == tokens0 and chosen == chosen0 and counts == counts0
    assert not any(held0) and sum(held) >= 10, held  # steps were held, and only where deferring
    if turning:  # drafting chosen again after the turn (the first steps only measure)
        assert K in chosen[-10:], chosen
    # a held step makes no call where the control follows; the held engine hands each request's last
    # tokens over as it leaves
    leaving = calls.pop("take_tokens")
    assert leaving == 2 and calls0.pop("take_tokens") == 0
    assert sum(calls0.values()) - sum(calls.values()) == sum(held), (calls, calls0)
    if not turning:  # drafts that never pay: plain decoding is chosen for good, held most of the time
        assert sum(held) > len(held) // 2


def test_steps_with_speculation_off_call_no_drafter_and_it_ends_with_every_token(target: str) -> None:
    """``set_speculation(False)``: after the prefill, no decode step calls the drafter; the proposer is
    handed each request's tokens once, in order, before it leaves (``take_tokens``), and the output is
    plain decoding's."""
    llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE_NGRAM)
    llm.set_speculation(False)
    calls, updates = _calls(llm), _updates(llm)
    outputs = llm.generate(PROMPTS[:2], GREEDY)
    plain = LLM(target, dtype="float64").generate(PROMPTS[:2], GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in plain]
    assert calls == {"follow": 1, "shadow": 0, "propose": 0, "take_tokens": 2}  # the prefill's, the leaving
    assert {o.request_id: o.outputs[0].token_ids for o in outputs} == updates


def test_a_drafter_that_does_not_defer_is_called_every_step(target: str) -> None:
    """Negative control: a draft model's state advances with its own forward, so it is never held."""
    spec = {"method": "draft_model", "model": target, "num_speculative_tokens": K}
    llm = LLM(target, dtype="float64", speculative_config=spec)
    llm.set_speculation(False)
    drafter: Any = llm.engine.drafter
    assert not drafter.defers_follow
    calls = _calls(llm)
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert calls["propose"] == len(out[0].outputs[0].token_ids)  # the prefill's draft-next and each step's


def test_the_suffix_cache_holds_whole_responses_after_held_steps(target: str) -> None:
    """A suffix proposer caches a response when its request leaves: after steps that never called it
    (speculation off), the cached response is still the whole output (it would be the first token
    alone if the held steps' tokens were not handed over before the request left)."""
    spec = {"method": "suffix", "num_speculative_tokens": K, "adaptive_draft_length": True}
    llm = LLM(target, dtype="float64", speculative_config=spec)
    llm.set_speculation(False)
    out = llm.generate([PROMPTS[0]], GREEDY)[0].outputs[0].token_ids
    proposer: Any = llm.engine.drafter.proposer  # type: ignore[union-attr]
    assert [list(response) for _, response in proposer._cached] == [out]


def _settled() -> AdaptiveDraftLength:
    """A policy that measured plain decoding and costly drafts, and chose plain decoding at step 1."""
    policy = AdaptiveDraftLength(K)
    for _ in range(MIN_SAMPLES):
        policy.observe(1, 0, 1.0, [0], 0)
    policy.observe(1, K, 2.0, [K], 0)
    policy.observe(1, K, 2.0, [K], 0)
    assert policy.choose(1, [0.1]) == 0 and policy.settled is not None
    return policy


class _Request:
    def __init__(self, request_id: str, tokens: list[int] | None = None) -> None:
        self.request_id, self.output_token_ids, self.finished = request_id, tokens or [], False


def test_a_hold_lasts_until_a_shadow_is_due_or_the_next_re_measurement() -> None:
    policy, request = _settled(), _Request("a")
    policy.hold([request], shadowed=True)
    assert policy.hold_until == 0 and not policy.held([request])  # never shadowed: due now
    policy.shadows.record(request, [], step=1)  # nothing found: its next shadow two periods later
    policy.hold([request], shadowed=True)
    assert policy.hold_until == 1 + 2 * SHADOW_EVERY
    steps = [policy.held([request]) for _ in range(2 * SHADOW_EVERY)]
    assert steps == [True] * (2 * SHADOW_EVERY - 1) + [False]
    assert policy.chosen == [0] * (2 * SHADOW_EVERY) and policy.steps == 2 * SHADOW_EVERY
    policy.hold([request], shadowed=False)  # a drafter that cannot shadow: the next re-measurement
    assert policy.hold_until == policy.next_explore


def test_a_hold_ends_with_the_batch_and_with_a_shadow_that_pays() -> None:
    policy, request = _settled(), _Request("a", [1])
    drafted = policy.drafted
    policy.shadows.record(request, [7, 8], step=1)
    policy.hold([request], shadowed=True)
    assert policy.held([request]) and not policy.held([request, _Request("b")])  # another batch size
    request.output_token_ids.append(9)  # the first draft was wrong: the acceptance fell, still held
    assert policy.held([request]) and policy.drafted == drafted + 2 and policy.accepted == 0
    policy.shadows.record(request, [4], step=policy.steps)
    policy.hold([request], shadowed=True)
    request.output_token_ids.append(4)  # accepted: the next step decides
    assert not policy.held([request]) and policy.accepted == 1 and policy.hold_until == 0
    policy.hold_until = policy.steps + 5
    policy.end_hold()
    assert not policy.held([request])


def test_a_hold_is_for_its_requests_not_any_batch_of_their_size() -> None:
    """A group retried request by request after a failure decides at batch 1 for each: a hold set for
    one request does not hold another (its own choice and shadows may differ)."""
    policy, request = _settled(), _Request("a")
    policy.shadows.record(request, [], step=1)
    policy.hold([request], shadowed=True)
    other = _Request("b")
    assert not policy.held([other]) and policy.held([request])


def test_a_drafter_failing_on_the_last_tokens_leaves_the_output_whole(
    target: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Speculation off: the proposer is handed the tokens as the request leaves, and fails there. The
    request's output is complete and stays as it ended (``length``); the failure is the drafter's, logged
    with the request and the proposer's message."""
    llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE_NGRAM)
    llm.set_speculation(False)
    proposer: Any = llm.engine.drafter.proposer  # type: ignore[union-attr]
    update = proposer.update

    def failing(request_id: str, tokens: Any) -> None:
        if len(tokens) > 1:  # the held steps' tokens, as the request leaves
            raise RuntimeError("index full")
        update(request_id, tokens)

    proposer.update = failing
    with caplog.at_level("ERROR", logger="spec_backend.engine"):
        out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 12
    assert f"request {out.request_id}'s last tokens" in caplog.text and "index full" in caplog.text


def test_no_hold_before_the_costs_are_measured_nor_while_drafting() -> None:
    fresh, request = AdaptiveDraftLength(K), _Request("a")
    fresh.shadows.record(request, [], step=0)
    assert fresh.choose(1, [0.1]) == 0 and fresh.settled is None  # plain decoding measured first
    fresh.hold([request], shadowed=True)
    assert not fresh.held([request])
    policy = _settled()
    assert policy.choose(1, [1.0]) == K and policy.settled is None


def _steps_of(llm: LLM, found_nothing: bool) -> list[tuple[bool, bool]]:
    """Per decode step of ``llm``'s engine: (held, shadowed); with ``found_nothing``, every shadow finds
    no draft (a lookup that misses, as on open chat)."""
    drafter: Any = llm.engine.drafter
    shadow, holds, steps = drafter.shadow, llm.engine.holds_plain, []

    def missing(inputs: Any) -> Any:
        got = shadow(inputs)
        steps[-1][1] = True
        return got if got is None or not found_nothing else ([[] for _ in got[0]], got[1])

    def recorded(requests: Any) -> bool:
        steps.append([holds(requests), False])
        return bool(steps[-1][0])

    drafter.shadow, llm.engine.holds_plain = missing, recorded  # type: ignore[method-assign]
    return steps  # type: ignore[return-value]


def test_a_shadow_that_finds_nothing_holds_from_its_own_step(target: str) -> None:
    """Shadows that found no draft leave nothing to resolve: the plain-decoding choice holds from the step
    that asked them (before, the step after every shadow decided again, to the same choice, and called
    the drafter). Against an engine that decides every step (the control): the same choices and tokens."""
    runs = []
    for defers in (True, False):
        llm = LLM(target, dtype="float64", speculative_config=ADAPTIVE_NGRAM)
        _charged(llm, 0.2, wrong=True)
        drafter: Any = llm.engine.drafter
        drafter.defers_follow = defers
        steps = _steps_of(llm, found_nothing=True)
        out = llm.generate([PROMPTS[0]], GREEDY)[0].outputs[0].token_ids
        assert llm.engine.adaptive is not None
        runs.append((out, llm.engine.adaptive.chosen, steps))
    (tokens, chosen, steps), (tokens0, chosen0, steps0) = runs
    assert tokens == tokens0 and chosen == chosen0
    after_shadows = [held for (_, shadowed), (held, _) in itertools.pairwise(steps) if shadowed]
    assert len(after_shadows) >= 3 and all(after_shadows), steps
    assert not any(held for held, _ in steps0)
