"""The rejection sampler captured beside the decode step's forward (``runtime/captured_verify.py``).

A backend with graphs on over the strict simulated driver (``SimulatedGraphDriver(strict=True)``: any
host read, or tensor made from host data, inside a captured callable raises, as a device graph refuses or
freezes it) takes the captured path: the verify step's and the one-token step's forwards, then their
samplers' graphs. Outputs must equal the eager engine's token for token, greedy and seeded sampled, with
every drafter kind of input (point-mass drafts, draft probabilities, logits processors) and one host read
per decode step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_engine_graphs import NGRAM, PROMPTS, K, SimulatedGraphBackend
from test_step_syncs import PARAMS as SYNC_PARAMS
from test_step_syncs import SPECS

from spec_backend.backends.base import CapturePolicy
from spec_backend.backends.graph_common import GraphUnsafeCall, PaddedGraphRunner, SimulatedGraphDriver
from spec_backend.engine import LLM, SamplingParams
from spec_backend.runtime import captured_verify
from spec_backend.runtime.captured import GraphCaptureError
from spec_backend.runtime.captured_verify import CapturedVerify
from spec_backend.sampling.tuning import SamplerTuning
from spec_backend.testing import host_reads
from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3
from spec_backend.tools.tiny import make_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
SAMPLED = SamplingParams(temperature=0.8, seed=3, max_tokens=16)
MIXED = [
    GREEDY,
    SamplingParams(temperature=1.1, seed=7, max_tokens=14),
    SamplingParams(temperature=0.0, max_tokens=9),
]


class StrictGraphs(SimulatedGraphBackend):
    """The simulated graphs over the strict driver; ``graphs``: how many graph runners it makes before
    its capture policy reports none left (``None``: no limit)."""

    name = "strict-simulated-graphs"

    def __init__(self, graphs: int | None = None) -> None:
        super().__init__()
        self.graphs = graphs

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        spent = self.graphs is not None and len(self.runners) >= self.graphs
        return CapturePolicy(max_capture_size=2 * (K + 1), graph_budget=0 if spent else None, enabled=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("captured-verify"), "llama")


def _ids(llm: LLM, params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


def _samplers(llm: LLM) -> dict[tuple[int, str], Any]:
    """(tokens per request, kind) -> that captured sampler's graph runner."""
    found = {}
    for captured in (llm.engine.captured, llm.engine.captured_plain):
        assert captured is not None and captured.verify is not None
        for kind, runner in captured.verify.runners.items():
            found[captured.q, kind] = runner
    return found


def _replays(llm: LLM) -> dict[tuple[int, str], int]:
    return {key: runner.replays + runner.eager_calls for key, runner in _samplers(llm).items()}


@pytest.mark.parametrize(
    ("params", "kind"),
    [(GREEDY, "greedy"), (SAMPLED, "sampled"), (MIXED, "sampled")],
    ids=["greedy", "sampled", "mixed"],
)
def test_captured_sampler_equals_eager(target: str, params: Any, kind: str) -> None:
    """n-gram drafts (point masses): every decode step is verified by the captured sampler of its kind,
    the verify step's and the one-token step's, and the tokens are the eager engine's."""
    reference = LLM(target, dtype="float64", speculative_config=NGRAM)
    eager = _ids(reference, params)
    llm = LLM(target, dtype="float64", speculative_config=NGRAM, backend=StrictGraphs(), max_num_seqs=4)
    assert _ids(llm, params) == eager
    counts = [
        (m.total.num_draft_tokens, m.total.num_accepted_tokens) for m in (llm.metrics, reference.metrics)
    ]
    assert counts[0] == counts[1] and counts[0][0] > 0  # drafts verified and accepted alike
    calls = _replays(llm)
    other = "sampled" if kind == "greedy" else "greedy"
    assert calls[K + 1, kind] > 0 and calls[1, kind] > 0, calls  # steps with drafts and without
    assert calls[K + 1, other] == calls[1, other] == 0, calls
    samplers = _samplers(llm)
    assert samplers[1, kind].replays > 0  # a replayed graph, not only the eager calls above the largest


def test_every_sampler_graph_set_shares_one_logits_buffer(target: str) -> None:
    """The sampler's four graph sets (greedy and sampled, of the verify step and of the one-token step)
    read their logits from one static buffer, written once a step (before, each set cloned its own
    [largest, V] float32 buffer: four, ~1.2 GB at V = 152k and 512 tokens, and a step copied its logits
    twice). Greedy and sampled steps through the same buffer keep the eager engine's tokens."""
    llm = LLM(target, dtype="float64", speculative_config=NGRAM, backend=StrictGraphs(), max_num_seqs=4)
    buffers = {key: runner.static_inputs["logits"] for key, runner in _samplers(llm).items()}
    assert len(buffers) == 4 and len({b.data_ptr() for b in buffers.values()}) == 1, buffers.keys()
    captured = llm.engine.captured
    assert captured is not None and captured.verify is not None
    assert captured.verify.logits.data_ptr() == next(iter(buffers.values())).data_ptr()
    reference = LLM(target, dtype="float64", speculative_config=NGRAM)
    for params in (GREEDY, SAMPLED, GREEDY):
        assert _ids(llm, params) == _ids(reference, params)
    assert all(n > 0 for n in _replays(llm).values())


class IndexedDevice(StrictGraphs):
    """A backend whose ``device()`` names an index its tensors do not report (CUDA's is the other way:
    ``cuda`` for tensors that report ``cuda:0``); torch compares the two unequal."""

    def device(self) -> torch.device:
        return torch.device("cpu", 0)


def test_the_shared_logits_buffer_is_taken_on_a_device_named_without_its_index(target: str) -> None:
    """The second sampler set checks the shared buffer's device: a device named with an index on one side
    only is the same device (before, every CUDA engine with a drafter failed at start-up: the buffer is on
    ``cuda:0``, ``Backend.device()`` is ``cuda``)."""
    llm = LLM(target, dtype="float64", speculative_config=NGRAM, backend=IndexedDevice(), max_num_seqs=4)
    buffers = {runner.static_inputs["logits"].data_ptr() for runner in _samplers(llm).values()}
    assert len(buffers) == 1
    assert _ids(llm, GREEDY) == _ids(LLM(target, dtype="float64", speculative_config=NGRAM), GREEDY)


def test_devices_named_with_and_without_an_index() -> None:
    """CUDA's case without a GPU: ``cuda`` (``Backend.device()``) is the ``cuda:0`` a tensor reports, not
    ``cuda:1``, and no CPU device."""
    cuda, same = torch.device("cuda"), captured_verify._same_device
    assert same(torch.device("cuda", 0), cuda) and same(torch.device("cuda", 1), torch.device("cuda", 1))
    assert not same(torch.device("cuda", 1), torch.device("cuda", 0)) and not same(torch.device("cpu"), cuda)


def test_plain_decoding_verifies_in_its_graph(target: str) -> None:
    """Without a drafter the one-token step is the captured one, and its sampler too."""
    eager = _ids(LLM(target, dtype="float64"), SAMPLED)
    llm = LLM(target, dtype="float64", backend=StrictGraphs(), max_num_seqs=4)
    assert _ids(llm, SAMPLED) == eager
    captured = llm.engine.captured
    assert captured is not None and captured.q == 1 and captured.verify is not None
    assert captured.verify.runners["sampled"].replays > 0


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=5, seed=3, max_tokens=12),
        SamplingParams(temperature=0.8, top_p=0.8, seed=3, max_tokens=12),
        SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.3),
    ],
    ids=["top-k", "top-p", "logits-processor"],
)
def test_steps_outside_the_graphs_verify_eagerly(target: str, params: SamplingParams) -> None:
    """Top-k, top-p and logits processors are not captured: those steps verify eagerly after the
    forward's replay (no sampler graph runs), with the eager engine's tokens."""
    eager = _ids(LLM(target, dtype="float64", speculative_config=NGRAM), params)
    llm = LLM(target, dtype="float64", speculative_config=NGRAM, backend=StrictGraphs(), max_num_seqs=4)
    assert _ids(llm, params) == eager
    assert not any(_replays(llm).values())
    plain = llm.engine.captured_plain
    assert plain is not None and plain.graph.replays > 0  # forwards replayed, samplers not


@pytest.mark.parametrize(
    ("method", "params", "kinds"),
    [
        ("strict", GREEDY, {"greedy"}),
        ("strict", SAMPLED, {"sampled"}),  # argmax drafts: point masses
        ("probabilistic", SAMPLED, set()),  # sampled drafts with their probabilities
    ],
    ids=["greedy", "sampled-point-masses", "sampled-with-probabilities"],
)
def test_eagle3_drafts_verify_in_the_graph_unless_they_carry_probabilities(
    target: str, tmp_path: Path, method: str, params: SamplingParams, kinds: set[str]
) -> None:
    """EAGLE-3: argmax drafts (``strict``) go through the captured sampler of the batch's kind; sampled
    drafts carry their probabilities and are verified eagerly. Every case has the eager engine's tokens."""
    spec = {
        "adaptive_draft_length": False,
        "method": "eagle3",
        "model": write_eagle3(tmp_path / "e3", target, "speculators", aux_ids=[0, 1, 2]),
        "num_speculative_tokens": K,
        "rejection_sample_method": method,
    }
    eager = _ids(LLM(target, dtype="float64", speculative_config=spec), params)
    llm = LLM(target, dtype="float64", speculative_config=spec, backend=StrictGraphs(), max_num_seqs=4)
    assert _ids(llm, params) == eager
    assert {kind for (q, kind), n in _replays(llm).items() if q == K + 1 and n} == kinds


def test_a_captured_step_reads_the_device_once(target: str) -> None:
    llm = LLM(target, dtype="float64", speculative_config=NGRAM, backend=StrictGraphs(), max_num_seqs=4)
    counts = host_reads.reads_per_decode_step(llm, PROMPTS, SAMPLED)
    assert counts and max(counts) == 1, counts
    assert sum(_replays(llm).values()) > 0


def test_the_strict_driver_refuses_host_reads_and_host_data() -> None:
    """Negative controls of the driver the tests above rely on: a callable that reads a value back, or
    makes a tensor from a list, fails at capture; a lenient driver lets both through."""

    def reads(x: torch.Tensor) -> torch.Tensor:
        return x * int(x.sum().item())

    def copies(x: torch.Tensor) -> torch.Tensor:
        return x + torch.tensor([1.0] * x.shape[0])

    for fn in (reads, copies):
        example = {"x": torch.ones(4)}
        with pytest.raises(GraphUnsafeCall, match="inside a captured graph"):
            PaddedGraphRunner(fn, (2, 4), SimulatedGraphDriver(strict=True), progress=False).capture(example)
        PaddedGraphRunner(fn, (2, 4), SimulatedGraphDriver(), progress=False).capture(example)


def test_a_sampler_that_cannot_be_captured_is_refused_by_name(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    verify = CapturedVerify._verify

    def reading(self: CapturedVerify, *args: Any) -> torch.Tensor:
        out = verify(self, *args)
        return out + int(out.sum().item()) * 0

    monkeypatch.setattr(CapturedVerify, "_verify", reading)
    with pytest.raises(GraphCaptureError, match=r"rejection sampler.*enforce_eager=True"):
        LLM(target, dtype="float64", speculative_config=NGRAM, backend=StrictGraphs(), max_num_seqs=4)


def test_without_graphs_left_the_sampler_runs_eagerly(target: str) -> None:
    """A backend whose graphs are spent by the forwards (Ascend's streams) captures no sampler; steps
    verify eagerly after the replayed forward, with the same tokens."""
    backend = StrictGraphs(graphs=2)
    llm = LLM(target, dtype="float64", speculative_config=NGRAM, backend=backend, max_num_seqs=4)
    assert llm.engine.captured is not None and llm.engine.captured.verify is None
    assert llm.engine.captured_plain is not None and llm.engine.captured_plain.verify is None
    eager = _ids(LLM(target, dtype="float64", speculative_config=NGRAM), GREEDY)
    assert _ids(llm, GREEDY) == eager
    assert llm.engine.captured_plain.graph.replays > 0


RULES = {
    "standard": {"rejection_sample_method": "standard"},
    "block": {"rejection_sample_method": "block"},
    "synthetic": {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5},
    "fly": {"rejection_sample_method": "fly"},
}


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("params", [GREEDY, MIXED], ids=["greedy", "mixed"])
def test_every_rule_verifies_in_the_graph_as_eagerly(target: str, rule: str, params: Any) -> None:
    """Block verification, synthetic acceptance and FLy run inside the sampler's graphs too (no host
    read there: the strict driver would refuse it), with the eager engine's tokens."""
    spec = {**NGRAM, **RULES[rule]}
    eager = _ids(LLM(target, dtype="float64", speculative_config=spec), params)
    llm = LLM(target, dtype="float64", speculative_config=spec, backend=StrictGraphs(), max_num_seqs=4)
    assert _ids(llm, params) == eager
    assert sum(n for (q, _), n in _replays(llm).items() if q == K + 1) > 0


@pytest.mark.parametrize(
    "config",
    [
        {"enable_entropy_verify": True, "posterior_threshold": 0.5, "posterior_alpha": 0.3},  # lossy
        {"enable_block_verify": True, "block_verify_mode": "cumulative"},  # vllm-ascend's rule (lossy)
    ],
    ids=["entropy", "cumulative"],
)
def test_lossy_rules_verify_in_the_graph_as_eagerly(target: str, config: dict[str, Any]) -> None:
    additional = {"rejection_sampler_config": config}
    eager = LLM(target, dtype="float64", speculative_config=NGRAM, additional_config=additional)
    llm = LLM(
        target,
        dtype="float64",
        speculative_config=NGRAM,
        additional_config=additional,
        backend=StrictGraphs(),
        max_num_seqs=4,
    )
    assert llm.engine.verifier.sampler.mode_name != "standard"  # the rule asked for
    assert _ids(llm, MIXED) == _ids(eager, MIXED)
    assert sum(n for (q, _), n in _replays(llm).items() if q == K + 1) > 0


class GroupedSampler(StrictGraphs):
    """A backend whose sampler verifies sampled batches above ``elements`` logits in groups of requests
    (``SamplerTuning.group_elements``: built on the host, so not capturable)."""

    def __init__(self, elements: int) -> None:
        super().__init__()
        self.elements = elements

    def sampler_tuning(self) -> SamplerTuning:
        return SamplerTuning(group_elements=self.elements)


def test_a_sampler_that_verifies_in_groups_keeps_sampled_steps_eager(target: str) -> None:
    """Groups are cut on the host from the batch's logits: the sampled kind is not captured where the
    largest step's logits would be grouped (it failed the engine's start-up: a host read inside the
    capture), greedy steps (never grouped) still are, and the tokens are the eager engine's."""
    vocab = 128  # the tiny model's
    llm = LLM(
        target, dtype="float64", speculative_config=NGRAM, backend=GroupedSampler(3 * vocab), max_num_seqs=4
    )
    captured = llm.engine.captured
    assert captured is not None and captured.verify is not None
    assert set(captured.verify.runners) == {"greedy"}  # 8 rows of 128 logits > 3 x 128
    assert llm.engine.captured_plain is not None and llm.engine.captured_plain.verify is not None
    assert set(llm.engine.captured_plain.verify.runners) == {"greedy"}  # 4 rows > 3 x 128 too
    eager = LLM(target, dtype="float64", speculative_config=NGRAM)
    assert _ids(llm, MIXED) == _ids(eager, MIXED)
    roomy = LLM(
        target, dtype="float64", speculative_config=NGRAM, backend=GroupedSampler(8 * vocab), max_num_seqs=4
    )
    assert roomy.engine.captured is not None and roomy.engine.captured.verify is not None
    assert set(roomy.engine.captured.verify.runners) == {"greedy", "sampled"}  # negative control: fits


@pytest.mark.parametrize("params", ["greedy", "sampled"])
@pytest.mark.parametrize("method", [m for m in SPECS if m != "plain"])
def test_every_drafter_through_the_captured_step_equals_eager(
    target: str, tmp_path: Path, method: str, params: str
) -> None:
    """#38's acceptance on every drafter: greedy and seeded sampled output through the strict simulated
    graphs (the forwards and the sampler captured) equal the eager engine's, token for token."""
    spec = SPECS[method](target, tmp_path)
    sampling = SYNC_PARAMS[params]
    eager = _ids(LLM(target, dtype="float64", speculative_config=spec), sampling)
    llm = LLM(target, dtype="float64", speculative_config=spec, backend=StrictGraphs(), max_num_seqs=4)
    assert _ids(llm, sampling) == eager
    assert llm.engine.captured is not None and llm.engine.captured.verify is not None
