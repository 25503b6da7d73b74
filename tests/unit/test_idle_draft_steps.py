"""Steps that draft for no request (every budget 0: adaptive drafting chose plain decoding, or speculation
is off) skip the drafter's proposal where its state allows (``Drafter.follow``), so they cost what a plain
step costs: a host proposer only takes in the accepted tokens, and its drafts after such steps are those
of a proposer that saw every step; a drafter whose state advances with its own forward is still asked."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - autouse

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.contract import DraftOutput
from spec_backend.proposers.ngram import build_ngram_proposer
from spec_backend.testing.fixtures import draft_checkpoints

K = 4
PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1}


def _proposals(llm: LLM) -> list[tuple[tuple[int, ...], DraftOutput, list[list[int]]]]:
    """Each proposal of the engine's drafter: its budgets, its output and each request's tokens then."""
    calls: list[tuple[tuple[int, ...], DraftOutput, list[list[int]]]] = []
    drafter: Any = llm.engine.drafter
    propose = drafter.propose

    def spy(inputs: Any) -> DraftOutput:
        out: DraftOutput = propose(inputs)
        tokens = [[*r.prompt_token_ids, *r.output_token_ids] for r in inputs.requests]
        calls.append((tuple(inputs.budgets), out, tokens))
        return out

    drafter.propose = spy
    return calls


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], PARAMS)]


@pytest.fixture(scope="module")
def plain(target_dir: str) -> list[list[int]]:
    return _tokens(LLM(target_dir, dtype="float64"))


@pytest.fixture(scope="module")
def medusa(tmp_path_factory: pytest.TempPathFactory) -> str:
    return draft_checkpoints.write_medusa(tmp_path_factory.mktemp("medusa"), 32, 128, K, "vllm", 0)


def _spec(method: str, target: str, medusa: str) -> dict[str, Any]:
    extras: dict[str, dict[str, Any]] = {
        "ngram": NGRAM,
        "draft_model": {"model": target},
        "medusa": {"model": medusa},
    }
    extra = extras.get(method, {})
    return {"method": method, "num_speculative_tokens": K, **extra}


@pytest.mark.parametrize("method", ["ngram", "suffix", "medusa"])
def test_steps_with_speculation_off_do_not_propose(
    target_dir: str, plain: list[list[int]], medusa: str, method: str
) -> None:
    llm = LLM(target_dir, dtype="float64", speculative_config=_spec(method, target_dir, medusa))
    calls = _proposals(llm)
    llm.set_speculation(False)
    assert _tokens(llm) == plain
    assert calls == []
    llm.set_speculation(True)  # negative control: speculative steps propose
    assert _tokens(llm) == plain
    assert calls and all(any(budgets) for budgets, _, _ in calls)


def test_a_drafter_with_its_own_forward_is_asked_every_step(target_dir: str, plain: list[list[int]]) -> None:
    """A draft model's KV cache advances with its forward: it is not skipped (``follow`` is ``None``)."""
    llm = LLM(target_dir, dtype="float64", speculative_config=_spec("draft_model", target_dir, ""))
    calls = _proposals(llm)
    llm.set_speculation(False)
    assert _tokens(llm) == plain
    assert len(calls) >= PARAMS.max_tokens and not any(any(budgets) for budgets, _, _ in calls)


def test_drafts_after_idle_steps_are_those_of_a_proposer_that_saw_every_step(
    target_dir: str, plain: list[list[int]]
) -> None:
    """Adaptive drafting chooses K one step in four and plain decoding otherwise; each proposal equals a
    fresh proposer's given every token the request has (failed when ``follow`` fed no tokens)."""
    llm = LLM(target_dir, dtype="float64", speculative_config={**NGRAM, "adaptive_draft_length": True})
    adaptive = llm.engine.adaptive
    assert adaptive is not None
    turn = itertools.count()
    adaptive.choose = lambda batch, acceptances, mixed=False: K if next(turn) % 4 == 3 else 0  # type: ignore[method-assign]
    calls = _proposals(llm)
    assert _tokens(llm) == plain
    decode_calls = [c for c in calls if any(c[0])]
    assert len(decode_calls) < PARAMS.max_tokens // 2  # the idle steps did not propose
    drafted = 0
    for budgets, out, tokens in decode_calls:
        for b, budget in enumerate(budgets):
            fresh = build_ngram_proposer(llm.speculative_config)  # type: ignore[arg-type]
            fresh.add_request("r", tokens[b])
            want = fresh.propose(["r"], max_tokens=[budget])[0]
            assert out.token_ids[b, : out.num_draft_tokens[b]].tolist() == want
            drafted += len(want)
    assert drafted > 0  # the comparison saw drafts


def test_a_drafter_failing_to_follow_fails_its_requests_not_the_engine(target_dir: str) -> None:
    """``follow`` (and ``shadow``) run where ``propose`` does: an exception ends the step's requests with
    the drafter's error, and the engine serves the next request (before, it escaped the step, and the
    engine failed every unfinished request with "engine failed")."""
    llm = LLM(target_dir, dtype="float64", speculative_config=NGRAM)
    llm.set_speculation(False)
    drafter: Any = llm.engine.drafter
    follow = drafter.follow

    def broken(inputs: Any) -> Any:
        raise RuntimeError("lost the index")

    drafter.follow = broken
    result = llm.generate([PROMPTS[0]], PARAMS)[0]
    assert result.outputs[0].finish_reason == "error"
    assert result.outputs[0].error == "drafter failed: RuntimeError: lost the index"
    drafter.follow = follow  # negative control: the same engine, a working drafter
    assert llm.generate([PROMPTS[0]], PARAMS)[0].outputs[0].finish_reason == "length"
