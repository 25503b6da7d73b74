"""Async speculative steps (``engine/spec_ahead.py``): verify steps launched before the host lands the
step before them, drafted by ``ngram_gpu`` from that step's tokens on the device, give the synchronous
engine's tokens, token for token (greedy and seeded sampled), through the strict simulated graph driver
of a backend whose captured steps read lengths from the device; a step reads the device at most once;
steps that the conditions exclude stay synchronous.

Each equality test also counts the verify steps launched ahead (a path that fell back to synchronous
steps everywhere would pass the equality alone).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from engine_fixtures import PROMPTS, CapturingReference, one_thread  # noqa: F401 - autouse

from spec_backend.engine import LLM, SamplingParams, spec_ahead
from spec_backend.engine.lookahead import AHEAD_PER_DECISION
from spec_backend.engine.step_result import moved_rows
from spec_backend.testing import host_reads
from spec_backend.testing.simulated_graphs import SimulatedGraphsBackend
from spec_backend.tools.tiny import make_tiny_model

K = 3
NGRAM_GPU = {"method": "ngram_gpu", "num_speculative_tokens": K, "prompt_lookup_min": 1}
FIXED = NGRAM_GPU | {"adaptive_draft_length": False}
# greedy, seeded sampled, sampled with the engine's seed, greedy: long enough to go ahead for a while
MIXED = [
    SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True),
    SamplingParams(temperature=0.8, max_tokens=33, seed=5, ignore_eos=True),
    SamplingParams(temperature=1.0, max_tokens=25, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
]


def device_lengths() -> SimulatedGraphsBackend:
    """The strict simulated graphs, their captured attention reading lengths from the device (as CUDA's)."""
    return SimulatedGraphsBackend(max_capture_size=16)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("spec-ahead"), "llama")


def _llm(target: str, ahead: bool, backend: Any = None, **kwargs: Any) -> LLM:
    kwargs.setdefault("max_num_seqs", 4)
    kwargs.setdefault("speculative_config", FIXED)
    backend = backend if backend is not None else device_lengths()
    return LLM(target, dtype="float64", backend=backend, async_scheduling=ahead, **kwargs)


@pytest.fixture(autouse=True)
def no_fallback(request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture) -> Any:
    """A launch ahead that raised falls back to a synchronous step with the same tokens, so an equality
    alone would hide it: every test but the one that makes launches fail checks none did."""
    with caplog.at_level(logging.ERROR, logger="spec_backend.engine.lookahead"):
        yield
    if "failing_launch" not in request.node.name:
        failed = [r for r in caplog.get_records("call") if "a step launched ahead failed" in r.getMessage()]
        assert not failed, failed[0].exc_text


def _run(llm: LLM, prompts: list[list[int]], params: Any) -> list[tuple[Any, ...]]:
    outs = llm.generate(prompts, params)
    engine = llm.engine
    assert engine.slots.num_slots == 0 and engine.slots.consistent()
    assert engine.lookahead is None or engine.lookahead.flight is None
    # drafts never change the tokens (greedy, or seeded by position): the draft and acceptance counts
    # are what tells the drafts themselves apart
    return [
        (o.outputs[0].token_ids, o.outputs[0].finish_reason, o.num_draft_tokens, o.num_accepted_tokens)
        for o in outs
    ]


def _ahead(llm: LLM) -> int:
    assert llm.engine.lookahead is not None
    return llm.engine.lookahead.speculative_launches


def first_layer_draft(target: str, folder: Any) -> str:
    """The target's first decoder layer under its embeddings and head, as a draft model in ``folder``: its
    greedy drafts are accepted often but not always, so every accepted count (and a wrong draft state)
    shows."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def shallow(target: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return first_layer_draft(target, tmp_path_factory.mktemp("shallow-draft"))


def _draft_model(draft: str) -> dict[str, Any]:
    """``draft`` as a draft model, K drafts every step."""
    return {
        "method": "draft_model",
        "model": draft,
        "num_speculative_tokens": K,
        "adaptive_draft_length": False,
    }


@pytest.mark.parametrize("drafter", ["ngram_gpu", "draft_model"])
def test_tokens_equal_the_synchronous_engines(target: str, shallow: str, drafter: str) -> None:
    """Greedy and sampled requests (seeded, and the engine's seeds), four slots: every token, and every
    request's draft and acceptance counts, equal the synchronous engine's, and many decode steps went
    ahead: ``ngram_gpu``'s drafts matched on the device, or a draft model's (``draft_model_ahead``)."""
    spec = FIXED if drafter == "ngram_gpu" else _draft_model(shallow)
    sync = _llm(target, False, speculative_config=spec)
    expected = _run(sync, PROMPTS, MIXED)
    llm = _llm(target, True, speculative_config=spec)
    assert _run(llm, PROMPTS, MIXED) == expected
    assert llm.metrics.total.num_accepted_tokens == sync.metrics.total.num_accepted_tokens > 0
    assert llm.engine.num_steps == sync.engine.num_steps and _ahead(llm) > llm.engine.num_steps // 3


# plain decoding; a host drafter with speculation off for batches of 2+ (plain flights beside a drafter)
PLAIN_SPECS = [None, {**FIXED, "method": "ngram", "disable_by_batch_size": 2}]


@pytest.mark.parametrize("spec", PLAIN_SPECS, ids=["no-drafter", "speculation-off"])
def test_plain_steps_launched_from_the_device_give_the_synchronous_tokens(target: str, spec: Any) -> None:
    """Plain steps launched ahead over graphs that read device lengths feed the flight's token, count
    their RNG counters and lengths on the device (``launch_ahead``), and give the synchronous tokens."""
    expected = _run(_llm(target, False, speculative_config=spec), PROMPTS, MIXED)
    llm = _llm(target, True, speculative_config=spec)
    assert _run(llm, PROMPTS, MIXED) == expected
    lookahead = llm.engine.lookahead
    assert lookahead is not None and lookahead.launches_ahead > 20 and _ahead(llm) == 0


@pytest.mark.parametrize("drafter", ["ngram_gpu", "draft_model"])
def test_speculation_turning_back_on_drafts_before_steps_go_ahead(
    target: str, shallow: str, drafter: str
) -> None:
    """Speculation off at two requests (``disable_by_batch_size``) and on again once one ends: a draft
    model's cache then lags the tokens (a draft-next without drafts feeds nothing), so a synchronous
    draft-next of K drafts comes before any step goes ahead (``Drafter.ready_ahead``; review finding:
    its landing failed every request)."""
    spec = (FIXED if drafter == "ngram_gpu" else _draft_model(shallow)) | {"disable_by_batch_size": 2}
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (80, 20)]
    expected = _run(_llm(target, False, speculative_config=spec), PROMPTS[:2], params)
    llm = _llm(target, True, speculative_config=spec)
    assert _run(llm, PROMPTS[:2], params) == expected and _ahead(llm) > 5
    assert all(reason == "length" for _, reason, *_ in expected)


@pytest.mark.parametrize("drafter", ["ngram_gpu", "draft_model"])
@pytest.mark.parametrize("slots", [3, 6], ids=["admissions", "no-waiting"])
def test_requests_that_end_mid_flight_leave_and_the_others_follow_their_slots(
    target: str, shallow: str, slots: int, drafter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stop tokens taken from the synchronous run (each request ends at a token of its own, its next step
    in flight), other lengths, and more greedy requests than slots (admissions while steps go ahead) or
    not: the rows of the requests still running follow their moved slots."""
    prompts = [*PROMPTS, [7, 8, 7, 8, 7, 8, 9], [3, 1, 3, 1, 3]]
    spec = FIXED if drafter == "ngram_gpu" else _draft_model(shallow)
    greedy = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (50, 14, 41, 30, 9, 36)]
    sync = _run(_llm(target, False, max_num_seqs=slots, speculative_config=spec), prompts, greedy)
    stops = [
        SamplingParams(
            temperature=0.0, max_tokens=p.max_tokens, stop_token_ids=[t[j]] if len(t) > j + 1 else None
        )
        for (t, *_), p, j in zip(sync, greedy, (30, 11, 25, 12, 3, 20), strict=True)
    ]
    expected = _run(_llm(target, False, max_num_seqs=slots, speculative_config=spec), prompts, stops)
    assert sum(reason == "stop" for _, reason, *_ in expected) >= 3
    moved: list[bool] = []

    def counted(before: Any, now: Any) -> Any:
        index = moved_rows(before, now)
        moved.append(index is not None)
        return index

    monkeypatch.setattr(spec_ahead, "moved_rows", counted)
    llm = _llm(target, True, max_num_seqs=slots, speculative_config=spec)
    assert _run(llm, prompts, stops) == expected and _ahead(llm) > 0 and any(moved)


def test_a_decode_step_reads_the_device_once(target: str) -> None:
    """One device-to-host read per decode step, steps ahead included."""
    llm = _llm(target, True)
    reads = host_reads.reads_per_decode_step(llm, PROMPTS, MIXED)
    assert _ahead(llm) > 0 and max(reads) == 1, reads


class _LateReads(SimulatedGraphsBackend):
    """Simulated graphs whose reads wait for all queued work (no pinned copy and event)."""

    reads_early = False


@pytest.mark.parametrize("early", [True, False], ids=["early-reads", "late-reads"])
@pytest.mark.parametrize("spec", [FIXED, None], ids=["speculative", "plain"])
def test_a_step_is_launched_before_the_one_before_it_is_read(target: str, spec: Any, early: bool) -> None:
    """Where the backend's read waits for the step it copies alone (``reads_early``), step n+1 is
    launched from step n's device output before step n is read, its copy to the host started at its
    launch: the host prepares n+1 while n runs and lands n while n+1 runs. Where a read waits for all
    queued work, step n is read before n+1 is launched (a read after it would wait for n+1 too)."""
    backend = SimulatedGraphsBackend(max_capture_size=16) if early else _LateReads(max_capture_size=16)
    llm = _llm(target, True, backend, speculative_config=spec)
    expected = _run(_llm(target, False, speculative_config=spec), PROMPTS, MIXED)
    stepper: Any = llm.engine.stepper
    launch, unread, copying = stepper.launch, [], []

    def counted(requests: Any, ahead: Any, *rest: Any) -> Any:
        if ahead is not None:
            unread.append(ahead.result.unread)
        launched = launch(requests, ahead, *rest)
        copying.append(launched.result.host is not None)
        return launched

    stepper.launch = counted
    assert _run(llm, PROMPTS, MIXED) == expected
    if early:
        assert unread.count(True) > len(unread) // 2 and all(copying), (unread, copying)
    else:
        assert len(unread) > 10 and not any(unread) and not any(copying), (unread, copying)


@pytest.mark.parametrize("spec", [FIXED, *PLAIN_SPECS], ids=["speculative", "no-drafter", "speculation-off"])
def test_a_step_launched_ahead_copies_nothing_from_the_host(target: str, spec: Any) -> None:
    """Once a batch's slots are known, a step launched ahead makes no tensor from host data (on a GPU
    each such copy, from pageable memory, would wait for the step in flight, and the host could not
    prepare the next step while it runs): counters, lengths and slot indices come from the device."""
    llm = _llm(target, True, speculative_config=spec)
    stepper: Any = llm.engine.stepper
    launch, made = stepper.launch, []

    def counted(requests: Any, ahead: Any, speculative: bool = False) -> Any:
        with host_reads.CallCounter({torch.tensor, torch.as_tensor, torch.from_numpy}) as counter:
            out = launch(requests, ahead, speculative)
        if ahead is not None:  # steady: its flight was launched ahead, same requests
            steady = ahead.result.batch.static_shapes and ahead.requests == list(requests)
            made.append((counter.count, steady))
        return out

    stepper.launch = counted
    params = [SamplingParams(temperature=t, max_tokens=40, seed=3, ignore_eos=True) for t in (0.0, 0.7)] * 2
    _run(llm, PROMPTS, params)
    steady = [count for count, ok in made if ok]
    assert len(steady) > 10 and not any(steady), made
    if spec is FIXED:  # the counter counts: the first launch from a synchronous flight copies the slots
        assert any(count for count, _ in made), made


@pytest.mark.parametrize(
    ("backend", "spec"),
    [
        (CapturingReference, FIXED),  # captured attention re-issued host lengths (Ascend's)
        (device_lengths, {**FIXED, "method": "ngram"}),  # drafts on the host
        (device_lengths, FIXED | {"enforce_eager": True}),  # no captured verify step
    ],
    ids=["host-lengths", "host-ngram", "eager"],
)
def test_steps_outside_the_conditions_stay_synchronous(target: str, backend: Any, spec: Any) -> None:
    """Where the next step's drafts or lengths could not come from the device, no verify step goes
    ahead, and the tokens are the synchronous engine's."""
    sync = _run(_llm(target, False, backend(), speculative_config=spec), PROMPTS, MIXED)
    llm = _llm(target, True, backend(), speculative_config=spec)
    assert _run(llm, PROMPTS, MIXED) == sync and _ahead(llm) == 0


def _pinned_choices(llm: LLM, choose: Any) -> list[int]:
    """Pin ``llm``'s adaptive choices to ``choose(batch)`` (timed ones depend on the machine); returns
    the list to which each choice appends the count of speculative launches so far."""
    adaptive: Any = llm.engine.adaptive
    lookahead = llm.engine.lookahead
    assert adaptive is not None
    at: list[int] = []

    def pinned(batch: int, *args: Any, **kwargs: Any) -> int:
        at.append(lookahead.speculative_launches if lookahead is not None else 0)
        return int(choose(batch))

    adaptive.choose = pinned
    return at


@pytest.mark.parametrize("chosen", [K, 0])
def test_adaptive_drafting_goes_ahead_between_its_decisions(target: str, chosen: int) -> None:
    """With adaptive drafting on (the default), steps go ahead while its last choice drafts K, at most
    ``AHEAD_PER_DECISION`` of them between two choices (each made at a synchronous step it times); a
    choice of plain decoding sends none ahead. With the choices pinned the tokens must equal the
    synchronous engine's, sampled ones included."""
    sync = _llm(target, False, speculative_config=NGRAM_GPU)
    _pinned_choices(sync, lambda batch: chosen)
    expected = _run(sync, PROMPTS, MIXED)
    llm = _llm(target, True, speculative_config=NGRAM_GPU)
    at = _pinned_choices(llm, lambda batch: chosen)
    assert _run(llm, PROMPTS, MIXED) == expected
    ahead = _ahead(llm)
    if chosen:
        gaps = [b - a for a, b in zip([0, *at], [*at, ahead], strict=True)]
        assert ahead > AHEAD_PER_DECISION and max(gaps) == AHEAD_PER_DECISION, gaps
    else:
        assert ahead == 0


def test_a_new_batch_is_decided_before_steps_go_ahead(target: str) -> None:
    """Adaptive drafting chooses K for one request and plain decoding for two (pinned): a request that
    arrives while one runs ahead is admitted, and a synchronous step chooses for the pair before any
    step goes ahead, so no verify step of two requests is launched ahead."""
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    llm = _llm(target, True, max_num_seqs=2, speculative_config=NGRAM_GPU)
    _pinned_choices(llm, lambda batch: K if batch == 1 else 0)
    engine, stepper = llm.engine, llm.engine.stepper
    launch, launched = stepper.launch, []

    def counted(requests: Any, ahead: Any, speculative: bool = False) -> Any:
        launched.append((len(requests), speculative and ahead is not None))
        return launch(requests, ahead, speculative)

    stepper.launch = counted  # type: ignore[method-assign]
    first, second = llm.make_requests([PROMPTS[0], PROMPTS[2]], params)
    engine.add(first)
    for _ in range(6):
        engine.step()
    assert (1, True) in launched and engine.lookahead is not None and engine.lookahead.flight is not None
    engine.add(second)
    while engine.has_unfinished():
        engine.step()
    assert (2, True) not in launched and len(second.output_token_ids) == 60
    alone = _llm(target, False, max_num_seqs=1, speculative_config=NGRAM_GPU)
    assert [first.output_token_ids, second.output_token_ids] == [
        o.outputs[0].token_ids for o in alone.generate([PROMPTS[0], PROMPTS[2]], params)
    ]


def test_a_top_k_request_steps_synchronously_while_it_runs(target: str) -> None:
    """A request with top-k has no captured sampler kind: while it runs, steps are synchronous."""
    params = [*MIXED[:3], SamplingParams(temperature=0.9, top_k=5, seed=1, max_tokens=60, ignore_eos=True)]
    sync = _run(_llm(target, False), PROMPTS, params)
    llm = _llm(target, True)
    assert _run(llm, PROMPTS, params) == sync and _ahead(llm) == 0


def _failing(call: Any, when: set[int]) -> tuple[Any, dict[str, int]]:
    """``call``, raising a device fault at its calls numbered in ``when`` (from 1); and the call count."""
    calls = {"n": 0}

    def flaky(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] in when:
            raise RuntimeError("device fault")
        return call(*args)

    return flaky, calls


def test_a_failing_launch_ahead_lands_and_steps_synchronously(
    target: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A drafter that raises while drafting ahead: the flight lands, the engine steps synchronously
    (logged), and the tokens are unchanged."""
    expected = _run(_llm(target, False), PROMPTS, MIXED)
    llm = _llm(target, True)
    drafter: Any = llm.engine.drafter
    drafter.propose_ahead, _ = _failing(drafter.propose_ahead, {3, 4, 9})
    with caplog.at_level(logging.ERROR, logger="spec_backend.engine.lookahead"):
        assert _run(llm, PROMPTS, MIXED) == expected
    assert "a step launched ahead failed" in caplog.text and _ahead(llm) > 3


def test_a_failing_launch_from_the_synchronous_state_keeps_its_drafts(target: str) -> None:
    """A launch from the synchronous state (its drafts taken from ``PendingDrafts``) that fails before
    it runs: the synchronous step that retries it verifies those drafts (review finding: it verified
    none, so the draft counts differed while the tokens, which drafts never change, did not)."""
    expected = _run(_llm(target, False), PROMPTS, MIXED)
    llm = _llm(target, True)
    captured: Any = llm.engine.captured
    flaky, calls = _failing(captured.forward, {1})  # the first decode step's launch
    stepper: Any = llm.engine.stepper
    decode, held = stepper.decode, []

    def retried(requests: Any) -> Any:
        held.append(llm.engine.pending.total)
        return decode(requests)

    captured.forward, stepper.decode = flaky, retried
    assert _run(llm, PROMPTS, MIXED) == expected and calls["n"] > 1
    assert held and held[0] > 0  # the retry verifies the drafts the failed launch took
