"""Async scheduling (``engine/lookahead.py``): plain steps launched before the host lands the step before
them give the synchronous engine's tokens, token for token, eager and through the strict simulated graph
driver; steps that read host state are not launched ahead; a step reads the device at most once.

Each equality test also counts the steps launched ahead (a lookahead that fell back to synchronous steps
everywhere would pass the equality alone).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import PROMPTS, CapturingReference, one_thread  # noqa: F401 - autouse
from test_adaptive_engine import ADAPTIVE_NGRAM, K, _charged
from test_plain_holds import _wrong_until

from spec_backend.backends.reference import ReferenceBackend
from spec_backend.engine import LLM, SamplingParams
from spec_backend.testing import host_reads
from spec_backend.tools.tiny import make_tiny_model

# greedy, seeded sampled (the RNG counter of a step launched ahead counts the token not landed), a stop
# token set per prompt from the synchronous run, one token only (never stepped ahead)
MIXED = [
    SamplingParams(temperature=0.0, max_tokens=16),
    SamplingParams(temperature=0.8, max_tokens=9, seed=3),
    SamplingParams(temperature=1.0, max_tokens=12),
    SamplingParams(temperature=0.0, max_tokens=1),
]
GREEDY_80 = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("lookahead"), "llama")


def _llm(target: str, async_scheduling: bool, graphs: bool, **kwargs: Any) -> LLM:
    backend = CapturingReference() if graphs else None
    kwargs.setdefault("max_num_seqs", 3)
    return LLM(target, dtype="float64", backend=backend, async_scheduling=async_scheduling, **kwargs)


def _outputs(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[tuple[Any, ...]]:
    outs = llm.generate(prompts, params)
    engine = llm.engine
    assert engine.slots.num_slots == 0 and engine.slots.consistent()
    assert engine.lookahead is None or engine.lookahead.flight is None
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].stop_reason) for o in outs]


def _count_ahead(llm: LLM) -> dict[str, int]:
    """Counts of the steps ``llm`` launched ahead of a flight and of those it started (launches that
    returned: one that raised falls back to a synchronous step)."""
    counts = {"ahead": 0, "started": 0}
    stepper: Any = llm.engine.stepper
    launch = stepper.launch

    def counted(requests: Any, ahead: Any, *rest: Any) -> Any:
        launched = launch(requests, ahead, *rest)  # counted once it returned (a fallback would hide a raise)
        counts["ahead" if ahead is not None else "started"] += 1
        return launched

    stepper.launch = counted
    return counts


def _with_stops(sync: list[tuple[Any, ...]], params: list[SamplingParams]) -> list[SamplingParams]:
    """``params`` with a stop token each request emits at its fourth token in ``sync`` (where it has
    one): runs end mid-flight, their step launched ahead dropped."""
    out = []
    for (tokens, _, _), p in zip(sync, params, strict=True):
        stops = [tokens[3]] if len(tokens) > 4 else None
        kept = {"temperature": p.temperature, "max_tokens": p.max_tokens, "seed": p.seed}
        out.append(SamplingParams(**kept, stop_token_ids=stops))
    return out


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_tokens_equal_the_synchronous_engines(target: str, graphs: bool) -> None:
    prompts, params = PROMPTS * 3, MIXED * 3  # 12 requests through 3 slots: admissions drain flights
    sync = _outputs(_llm(target, False, graphs), prompts, params)
    llm = _llm(target, True, graphs)
    counts = _count_ahead(llm)
    assert _outputs(llm, prompts, params) == sync
    assert counts["ahead"] >= 20 and counts["started"] >= 4, counts
    stopped = _with_stops(sync, params)
    sync_stopped = _outputs(_llm(target, False, graphs), prompts, stopped)
    assert sum(reason == "stop" for _, reason, _ in sync_stopped) >= 6
    llm = _llm(target, True, graphs)  # a fresh engine: unseeded requests draw the same seeds
    counts = _count_ahead(llm)
    assert _outputs(llm, prompts, stopped) == sync_stopped
    assert counts["ahead"] >= 5, counts


def test_speculation_off_for_the_batch_steps_ahead(target: str) -> None:
    """An n-gram drafter with ``disable_by_batch_size``: steps of a full batch are plain and go ahead;
    once the batch shrinks below the limit the drafter drafts again, from every token landed (the step
    landing after a request left drafts for the requests in their new slots)."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    spec |= {"disable_by_batch_size": 3, "adaptive_draft_length": False}
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in (24, 6, 14, 9)]
    sync_llm = _llm(target, False, False, speculative_config=spec)
    sync = _outputs(sync_llm, PROMPTS, params)
    llm = _llm(target, True, False, speculative_config=spec)
    counts = _count_ahead(llm)
    assert _outputs(llm, PROMPTS, params) == sync
    assert counts["ahead"] >= 4, counts
    # the drafts may differ: a request admitted when one leaves joins a step later (the step in flight
    # was launched without it), and the step landing without it drafts for a smaller batch
    assert sync_llm.metrics.total.num_accepted_tokens > 0 and llm.metrics.total.num_accepted_tokens > 0


@pytest.mark.parametrize("turning", [False, True], ids=["drafts-never-pay", "drafts-start-paying"])
def test_held_steps_of_adaptive_drafting_go_ahead(target: str, turning: bool) -> None:
    """Adaptive n-gram drafting on the policy's step clock (``test_plain_holds``): steps held at plain
    decoding go ahead while the hold lasts past the next decision, and greedy tokens are the synchronous
    engine's; where drafts start paying, a shadow ends the hold and drafting is chosen again."""
    outputs, chosen, held = [], [], []
    params = [GREEDY_80, SamplingParams(temperature=0.0, max_tokens=40)]
    for setting in (False, True):
        llm = _llm(target, setting, False, speculative_config=ADAPTIVE_NGRAM, max_num_seqs=16)
        _charged(llm, 0.2, wrong=not turning)
        if turning:
            _wrong_until(llm, 40)
        counts = _count_ahead(llm)
        outputs.append(_outputs(llm, PROMPTS[:2], params))
        assert llm.engine.adaptive is not None
        chosen.append(llm.engine.adaptive.chosen)
        held.append(llm.engine.adaptive.held_steps)
    assert outputs[0] == outputs[1]
    assert counts["ahead"] >= 20, counts  # the async engine's
    # the policy holds as it did: a request ending mid-flight ends the hold one decision later
    assert abs(held[0] - held[1]) <= 2 and held[1] >= 20, held
    if turning:
        assert K in chosen[1][-10:], chosen[1]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=8, logprobs=2),
        SamplingParams(temperature=0.7, max_tokens=8, seed=1, repetition_penalty=1.3),
        SamplingParams(temperature=0.7, max_tokens=8, seed=1, min_tokens=4),
    ],
    ids=["logprobs", "penalty", "min_tokens"],
)
def test_requests_that_read_host_state_are_not_stepped_ahead(target: str, params: SamplingParams) -> None:
    plain = SamplingParams(temperature=0.0, max_tokens=8)
    mixed = [params, plain, plain, plain]
    sync = _outputs(_llm(target, False, False), PROMPTS, mixed)
    llm = _llm(target, True, False, max_num_seqs=4)
    counts = _count_ahead(llm)
    assert _outputs(llm, PROMPTS, mixed) == sync
    assert counts == {"ahead": 0, "started": 0}  # every step has that request: none goes ahead
    counts_plain = _count_ahead(llm)  # negative control: the same batch without it goes ahead
    llm.generate(PROMPTS, [plain] * 4)
    assert counts_plain["ahead"] > 0


def test_a_request_at_the_context_limit_drops_the_step_after(target: str) -> None:
    """A request reaching ``max_model_len`` at the step in flight drops the step launched after it, which
    wrote the position ``max_model_len - 1`` within its slot (the cache refuses a step past its slot)."""
    params = [SamplingParams(temperature=0.0, max_tokens=64)] * 4
    sync = _outputs(_llm(target, False, False, max_model_len=24), PROMPTS, params)
    assert [len(t) + len(p) for (t, _, _), p in zip(sync, PROMPTS, strict=True)] == [24] * 4
    llm = _llm(target, True, False, max_model_len=24)
    counts = _count_ahead(llm)
    assert _outputs(llm, PROMPTS, params) == sync
    assert counts["ahead"] > 0


def test_a_decode_step_reads_the_device_once(target: str) -> None:
    llm = _llm(target, True, True)
    counts = _count_ahead(llm)
    reads = host_reads.reads_per_decode_step(llm, PROMPTS, MIXED)
    assert counts["ahead"] > 0 and max(reads) == 1, reads


class _HostTensors(host_reads.CallCounter):
    """Counts tensors made from host data (on a GPU each is a copy that waits for the device's queue)
    while ``armed`` is set."""

    def __init__(self) -> None:
        super().__init__({torch.tensor, torch.as_tensor, torch.from_numpy})
        self.armed = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.armed and func in self.funcs:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_a_step_launched_ahead_copies_nothing_from_the_host_after_its_forward(
    target: str, graphs: bool
) -> None:
    """Once a launch has queued its forward, it queues the sampler without a copy from the host: on a
    GPU such a copy waits for the forward, and the host could not land the step before while it runs.
    Fails before the sampling metadata moved ahead of the forward (its RNG counters were copied after)."""
    llm = _llm(target, True, graphs)
    engine, counter = llm.engine, _HostTensors()
    owner: Any = engine.captured if graphs else engine.runner
    forward, stepper = owner.forward, engine.stepper
    launch, launches = stepper.launch, []

    def armed_forward(*args: Any) -> Any:
        out = forward(*args)
        counter.armed = True
        return out

    def counted_launch(requests: Any, ahead: Any, *rest: Any) -> Any:
        launches.append(ahead)
        counter.armed = False  # a prefill's forward armed it
        with counter:
            try:
                return launch(requests, ahead, *rest)
            finally:
                counter.armed = False

    owner.forward, stepper.launch = armed_forward, counted_launch
    llm.generate(PROMPTS, [SamplingParams(temperature=0.0, max_tokens=8)] * 4)
    assert len(launches) > 4 and counter.count == 0


def test_an_aborted_request_leaves_mid_flight(target: str) -> None:
    """Aborting a request between engine steps (a client gone) frees its slot while a step is in flight:
    the others' tokens are unchanged (the next step's inputs follow the moved slots)."""
    params = [SamplingParams(temperature=0.0, max_tokens=12)] * 4
    expected = _outputs(_llm(target, False, False, max_num_seqs=4), PROMPTS, params)
    llm = _llm(target, True, False, max_num_seqs=4)
    counts = _count_ahead(llm)
    engine = llm.engine
    requests = llm.make_requests(PROMPTS, params)
    for request in requests:
        engine.add(request)
    for _ in range(4):
        engine.step()
    assert engine.lookahead is not None and engine.lookahead.flight is not None
    engine.abort(requests[0], "client went away")
    while engine.has_unfinished():
        engine.step()
    assert requests[0].finish_reason == "error"
    assert [r.output_token_ids for r in requests[1:]] == [e[0] for e in expected[1:]]
    assert counts["ahead"] > 4 and engine.slots.num_slots == 0


def test_seeded_sampled_requests_keep_their_draft_positions_when_admissions_wait(target: str) -> None:
    """Three seeded sampled requests through two slots, speculation off at two requests (review
    finding): a step launched ahead would admit the third a step late, request 1 would run alone (and
    draft) from another position, and its sampled tokens would change. Fails before admissions kept
    their steps (no step goes ahead while a sampled request and a waiting one meet a drafter)."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    spec |= {"disable_by_batch_size": 2, "adaptive_draft_length": False}
    lengths = [5, 30, 20]
    params = [SamplingParams(temperature=1.0, seed=78 + j, max_tokens=m) for j, m in enumerate(lengths)]
    prompts = [PROMPTS[0], [11, 12, 13, 14] * 3 + [11, 12, 13], PROMPTS[3]]
    sync = _outputs(_llm(target, False, False, max_num_seqs=2, speculative_config=spec), prompts, params)
    llm = _llm(target, True, False, max_num_seqs=2, speculative_config=spec)
    counts = _count_ahead(llm)
    assert _outputs(llm, prompts, params) == sync
    assert counts["ahead"] > 0  # once nothing waits
    greedy = [SamplingParams(temperature=0.0, max_tokens=m) for m in lengths]  # greedy: ahead while
    llm = _llm(target, True, False, max_num_seqs=2, speculative_config=spec)  # requests wait too
    counts = _count_ahead(llm)
    sync_greedy = _outputs(
        _llm(target, False, False, max_num_seqs=2, speculative_config=spec), prompts, greedy
    )
    assert _outputs(llm, prompts, greedy) == sync_greedy and counts["ahead"] > 0


def test_aborting_every_running_request_mid_flight_leaves_no_flight(target: str) -> None:
    """Every running request aborted while a step is in flight (a server's clients gone, review
    finding): the flight goes with them, and the next request runs (before, its admission landed the
    stale flight and the step failed)."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    spec |= {"disable_by_batch_size": 2, "adaptive_draft_length": False}
    llm = _llm(target, True, False, max_num_seqs=4, speculative_config=spec)
    engine = llm.engine
    requests = llm.make_requests(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=20))
    for request in requests:
        engine.add(request)
    for _ in range(3):
        engine.step()
    assert engine.lookahead is not None and engine.lookahead.flight is not None
    for request in requests:
        engine.abort(request, "client gone")
    assert engine.lookahead.flight is None
    new = llm.make_requests([PROMPTS[2]], SamplingParams(temperature=0.0, max_tokens=8))[0]
    engine.add(new)
    while engine.has_unfinished():
        engine.step()
    assert new.finish_reason == "length" and len(new.output_token_ids) == 8


def test_a_failing_step_ahead_is_retried_synchronously(target: str) -> None:
    """A launch that raises lands the flight and steps again synchronously, where the failing request
    alone ends with an error (the synchronous step's isolation)."""
    params = [SamplingParams(temperature=0.0, max_tokens=10)] * 4
    expected = _outputs(_llm(target, False, False, max_num_seqs=4), PROMPTS, params)
    llm = _llm(target, True, False, max_num_seqs=4)
    verifier = llm.engine.verifier
    launch, calls = verifier.launch, {"n": 0}
    bad = str(llm._next_id + 1)

    def flaky(batch: Any, requests: list[Any], *args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 4 and any(r.request_id == bad for r in requests):
            raise RuntimeError("kernel fault")
        return launch(batch, requests, *args)

    verifier.launch = flaky  # type: ignore[method-assign]
    outs = _outputs(llm, PROMPTS, params)
    assert outs[1][1] == "error" and 0 < len(outs[1][0]) < 10
    assert [outs[i] for i in (0, 2, 3)] == [expected[i] for i in (0, 2, 3)]


class _QueueingBackend(ReferenceBackend):
    """The reference backend claiming a device that queues launched work (as CUDA's and Ascend's)."""

    name = "queueing"
    launches_async = True


@pytest.mark.parametrize(
    ("backend", "given", "on"),
    [
        (ReferenceBackend, None, False),
        (_QueueingBackend, None, True),
        (_QueueingBackend, False, False),
        (ReferenceBackend, True, True),
    ],
)
def test_the_default_follows_the_backend(
    target: str, backend: Callable[[], ReferenceBackend], given: bool | None, on: bool
) -> None:
    llm = LLM(target, backend=backend(), async_scheduling=given)
    assert llm.async_scheduling is on and (llm.engine.lookahead is not None) is on


def test_a_value_that_is_not_a_bool_is_refused(target: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"async_scheduling must be a bool or None, got 'yes'"):
        LLM(target, async_scheduling="yes")
