"""Graphs in the engine: the verify forward captured at multiples of K+1 and replayed with padding.

A CPU backend with the simulated graph driver (``SimulatedGraphDriver``: 'capture' keeps the callable,
'replay' re-runs it on the static buffers) takes the captured path: static buffers, padding to the next
captured size, eager above the largest. Its outputs must equal the eager engine's, token for token.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend.backends.base import CapturePolicy, GraphFn, GraphRunner
from spec_backend.backends.graph_common import PaddedGraphRunner, SimulatedGraphDriver
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.engine import LLM, SamplingParams
from spec_backend.tools.tiny import make_tiny_model

PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6],
    [40, 41, 42],
    [11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13],
]
K = 3
NGRAM = {
    "adaptive_draft_length": False,
    "method": "ngram",
    "num_speculative_tokens": K,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}


class SimulatedGraphBackend(ReferenceBackend):
    """The reference backend with graph capture on, over the strict simulated driver: a host read, or a
    tensor made from host data, inside a captured callable raises (``GraphUnsafeCall``), as a device
    graph refuses or freezes it."""

    name = "simulated-graphs"
    strict = True

    def __init__(self) -> None:
        self.runners: list[PaddedGraphRunner] = []

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        return CapturePolicy(max_capture_size=2 * (K + 1), graph_budget=None, enabled=True)

    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        runner = PaddedGraphRunner(fn, capture_sizes, SimulatedGraphDriver(self.strict), progress=False)
        self.runners.append(runner)
        return runner


def forwards(llm: LLM, backend: SimulatedGraphBackend) -> list[PaddedGraphRunner]:
    """The backend's runners but the samplers' captured beside the forwards (``captured_verify``)."""
    samplers = [
        runner
        for captured in (llm.engine.captured, llm.engine.captured_plain)
        if captured is not None and captured.verify is not None
        for runner in captured.verify.runners.values()
    ]
    return [r for r in backend.runners if all(r is not s for s in samplers)]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("graphs"), "llama")


def _ids(llm: LLM, params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def test_captured_verify_forward_equals_eager(llama_dir: str) -> None:
    eager = _ids(LLM(llama_dir, dtype="float64", speculative_config=NGRAM), GREEDY)
    backend = SimulatedGraphBackend()
    llm = LLM(llama_dir, dtype="float64", speculative_config=NGRAM, backend=backend, max_num_seqs=4)
    assert llm.engine.captured is not None
    runner, plain = forwards(llm, backend)  # the verify step, then the one-token step of steps without drafts
    assert runner.captured_sizes == (K + 1, 2 * (K + 1))  # multiples of K+1, capped by the policy
    assert plain.captured_sizes == (1, 2, 4)  # multiples of 1 up to max_num_seqs
    assert _ids(llm, GREEDY) == eager
    assert runner.replays > 0  # steps replayed a captured graph
    assert runner.eager_calls > 0  # 3 requests = 12 tokens: above the largest size (8) runs eagerly
    single = _ids_one(llm)
    assert single == eager[1]
    buffers = runner.static_inputs
    assert buffers["input_ids"].shape == (2 * (K + 1),)  # static buffers at the largest size


def _ids_one(llm: LLM) -> list[int]:
    return llm.generate([PROMPTS[1]], GREEDY)[0].outputs[0].token_ids


def test_padding_to_a_captured_size_gives_the_eager_output(llama_dir: str) -> None:
    """One request (K+1 tokens) replays size K+1; two requests replay 2(K+1); outputs match eager."""
    eager = LLM(llama_dir, dtype="float64", speculative_config=NGRAM)
    backend = SimulatedGraphBackend()
    llm = LLM(llama_dir, dtype="float64", speculative_config=NGRAM, backend=backend, max_num_seqs=2)
    runner, _ = forwards(llm, backend)
    for prompts in ([PROMPTS[0]], PROMPTS[:2]):
        want = [o.outputs[0].token_ids for o in eager.generate(prompts, GREEDY)]
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == want
    assert runner.replays > 0 and runner.eager_calls == 0  # max_num_seqs=2: every batch fits a graph


def test_draft_model_sampled_output_is_the_same_with_graphs(llama_dir: str, tmp_path: object) -> None:
    draft = make_tiny_model(str(tmp_path), "qwen2", seed=4)
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": draft,
        "num_speculative_tokens": K,
        "rejection_sample_method": "block",
    }
    params = [SamplingParams(temperature=0.9, seed=s, max_tokens=12) for s in range(len(PROMPTS))]
    eager = _ids(LLM(llama_dir, dtype="float64", speculative_config=spec, max_num_seqs=2), params)
    backend = SimulatedGraphBackend()
    llm = LLM(llama_dir, dtype="float64", speculative_config=spec, backend=backend, max_num_seqs=2)
    assert _ids(llm, params) == eager
    draft_step, verify, _ = forwards(llm, backend)  # captured in this order: the drafter is built first
    assert verify.captured_sizes == (K + 1, 2 * (K + 1)) and draft_step.captured_sizes == (1, 2)
    assert verify.replays > 0 and draft_step.replays > 0


def test_plain_decoding_replays_a_one_token_step(llama_dir: str) -> None:
    """Without speculation the decode step (one token per request) is captured and replayed too."""
    eager = _ids(LLM(llama_dir, dtype="float64"), GREEDY)
    backend = SimulatedGraphBackend()
    llm = LLM(llama_dir, dtype="float64", backend=backend, max_num_seqs=2)
    assert llm.engine.captured is not None and llm.engine.captured.q == 1
    (runner,) = forwards(llm, backend)
    assert runner.captured_sizes == (1, 2)  # multiples of 1 up to max_num_seqs
    assert _ids(llm, GREEDY) == eager
    assert runner.replays > 0 and runner.eager_calls == 0  # max_num_seqs=2: every batch fits a graph


def test_steps_without_drafts_replay_the_one_token_step(llama_dir: str) -> None:
    """``set_speculation(False)`` on an engine whose verify step (K+1 tokens) was captured: steps without
    drafts replay the one-token step captured beside it, a plain step's cost (they first ran eagerly: on
    an H100 a 1B model's no-draft steps took ~100 ms instead of ~5 ms; then they replayed the verify step
    with placeholders, which made K = 0 cost a verify step, so adaptive drafting could not fall back to
    plain decoding: 0.42x plain on the H200 at batch 64)."""
    eager = _ids(LLM(llama_dir, dtype="float64"), GREEDY)
    backend = SimulatedGraphBackend()
    llm = LLM(llama_dir, dtype="float64", speculative_config=NGRAM, backend=backend, max_num_seqs=2)
    llm.set_speculation(False)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].error for o in outs] == [None] * len(PROMPTS)
    assert [o.outputs[0].token_ids for o in outs] == eager
    verify, plain = forwards(llm, backend)
    assert verify.replays == 0 and verify.eager_calls == 0
    assert plain.replays > 0 and plain.eager_calls == 0  # max_num_seqs=2: every step replayed
    llm.set_speculation(True)  # steps with drafts replay the verify step again
    assert _ids(llm, GREEDY) == eager and verify.replays > 0


class _BudgetBackend(SimulatedGraphBackend):
    """A backend with a graph budget shared by its runners (as Ascend's streams are)."""

    def __init__(self, graphs: int) -> None:
        super().__init__()
        self.left = graphs

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        return CapturePolicy(max_capture_size=2 * (K + 1), graph_budget=self.left, enabled=True)

    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        self.left -= len(capture_sizes)
        return super().graph_runner(fn, capture_sizes)


def test_without_graphs_left_the_one_token_step_is_not_captured(llama_dir: str) -> None:
    """The verify step's sizes take the whole budget: the one-token step is not captured (its capture
    failed LLM(...) before: a budget of 0 graphs), and steps without drafts replay the verify step."""
    eager = _ids(LLM(llama_dir, dtype="float64"), GREEDY)
    backend = _BudgetBackend(2)
    llm = LLM(llama_dir, dtype="float64", speculative_config=NGRAM, backend=backend, max_num_seqs=2)
    assert llm.engine.captured is not None and llm.engine.captured_plain is None
    llm.set_speculation(False)
    assert _ids(llm, GREEDY) == eager
    (verify,) = backend.runners
    assert verify.replays > 0 and verify.eager_calls == 0
    roomy = LLM(
        llama_dir, dtype="float64", speculative_config=NGRAM, backend=_BudgetBackend(4), max_num_seqs=2
    )
    assert roomy.engine.captured_plain is not None  # negative control: 2 graphs left, (1, 2) captured


def test_the_one_token_step_is_replayed_only_where_it_has_fewer_rows(llama_dir: str) -> None:
    """One graph left for the one-token step: only its largest size (8 rows) is captured. A lone
    request's no-draft step replays the verify graph (4 rows) instead; three requests (12 verify rows,
    above the largest verify size) replay the one-token graph."""
    backend = _BudgetBackend(3)
    llm = LLM(llama_dir, dtype="float64", speculative_config=NGRAM, backend=backend, max_num_seqs=8)
    verify, plain = backend.runners
    assert verify.captured_sizes == (K + 1, 2 * (K + 1)) and plain.captured_sizes == (8,)
    llm.set_speculation(False)
    one = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:1], GREEDY)]
    assert plain.replays == 0 and verify.replays > 0
    every = _ids(llm, GREEDY)
    assert plain.replays > 0 and every[0] == one[0]


def test_enforce_eager_turns_capture_off(llama_dir: str) -> None:
    backend = SimulatedGraphBackend()
    llm = LLM(llama_dir, speculative_config=NGRAM, backend=backend, enforce_eager=True)
    assert llm.engine.captured is None and backend.runners == []
    spec_eager = {**NGRAM, "enforce_eager": True}
    llm = LLM(llama_dir, speculative_config=spec_eager, backend=SimulatedGraphBackend())
    assert llm.engine.captured is None


class _HostCopyDriver(SimulatedGraphDriver):
    """A driver whose capture fails as CUDA's does on an op that copies from pageable host memory."""

    def capture(self, call: Any, pool: Any) -> Any:
        raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")


class _UncapturableBackend(SimulatedGraphBackend):
    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        return PaddedGraphRunner(fn, capture_sizes, _HostCopyDriver(), progress=False)


def test_a_step_that_cannot_be_captured_is_refused_with_the_way_out(llama_dir: str) -> None:
    """A model op that graphs cannot hold fails LLM(...) with what failed and ``enforce_eager=True``,
    which then runs it."""
    from spec_backend.runtime.captured import GraphCaptureError

    with pytest.raises(GraphCaptureError, match=r"LlamaForCausalLM .* Cannot copy .* enforce_eager=True"):
        LLM(llama_dir, speculative_config=NGRAM, backend=_UncapturableBackend())
    llm = LLM(llama_dir, speculative_config=NGRAM, backend=_UncapturableBackend(), enforce_eager=True)
    assert llm.engine.captured is None and len(_ids(llm, GREEDY)[0]) == GREEDY.max_tokens


def test_reference_backend_runs_eagerly(llama_dir: str) -> None:
    llm = LLM(llama_dir, speculative_config=NGRAM)
    assert llm.engine.captured is None  # CapturePolicy.enabled is False on the reference backend


@pytest.mark.parametrize("method", ["eagle", "eagle3", "peagle", "dflash", "dspark", "mtp"])
def test_hidden_state_drafters_read_through_the_captured_step(
    llama_dir: str, tmp_path: Path, method: str
) -> None:
    """The captured callable returns (logits, final or aux hidden states): drafts are the same as eager."""
    from engine_fixtures import record_drafts

    from spec_backend.testing.fixtures import draft_checkpoints as w
    from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark

    if method == "mtp":
        from test_drafter_mtp import write_glm_with_mtp

        llama_dir = write_glm_with_mtp(tmp_path / "glm", nextn=1)
        spec: dict[str, object] = {
            "adaptive_draft_length": False,
            "method": "mtp",
            "num_speculative_tokens": K,
        }
    else:
        head = {
            "eagle": lambda: w.write_eagle1(tmp_path / "h", llama_dir, bias=True),
            "eagle3": lambda: w.write_eagle3(
                tmp_path / "h", llama_dir, "speculators", draft_vocab=64, aux_ids=[0, 1, 2]
            ),
            "peagle": lambda: w.write_eagle3(tmp_path / "h", llama_dir, "peagle", aux_ids=[0, 1, 2]),
            "dflash": lambda: w.write_dflash(tmp_path / "h", llama_dir, target_layer_ids=[0, 1]),
            "dspark": lambda: write_dspark(
                tmp_path / "h", llama_dir, target_layer_ids=[0, 1], markov="gated"
            ),
        }[method]()
        spec = {
            "adaptive_draft_length": False,
            "method": "eagle3" if method == "peagle" else method,
            "model": head,
            "num_speculative_tokens": K,
        }
    eager = LLM(llama_dir, dtype="float64", speculative_config=spec, max_num_seqs=2)
    backend = SimulatedGraphBackend()
    llm = LLM(llama_dir, dtype="float64", speculative_config=spec, backend=backend, max_num_seqs=2)
    drafts = record_drafts(eager), record_drafts(llm)
    assert _ids(llm, GREEDY) == _ids(eager, GREEDY)
    assert drafts[0] == drafts[1] and len(drafts[0]) > 1  # every step drafted the same from the same states
    assert backend.runners[0].replays > 0


class TreeGraphBackend(SimulatedGraphBackend):
    """Captures up to two requests of a 6-node tree (7 tokens each)."""

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        return CapturePolicy(max_capture_size=14, graph_budget=None, enabled=True)


@pytest.mark.parametrize("tree", ["static", "dynamic", "paths"])
def test_token_tree_steps_replay_a_captured_graph(llama_dir: str, tmp_path: Path, tree: str) -> None:
    """A tree verify step captured at 1 + nodes tokens per request (padding nodes hang off the root; each
    request's ancestor mask and depths are graph inputs): greedy and seeded sampled tokens equal the
    eager engine's — a static tree, a dynamic one, and two i.i.d. paths of 3 (a trie of up to 6 nodes)."""
    from spec_backend.testing.fixtures import draft_checkpoints as w
    from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark

    if tree in ("static", "paths"):
        head = write_dspark(tmp_path / "h", llama_dir, target_layer_ids=[0, 1], block_size=4)
        shape: dict[str, object] = (
            {"speculative_token_tree": "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"}
            if tree == "static"
            else {"tree_paths": 2, "rejection_sample_method": "probabilistic"}
        )
        spec = {
            "adaptive_draft_length": False,
            "method": "dspark",
            "model": head,
            "num_speculative_tokens": K,
            **shape,
        }
    else:
        head = w.write_eagle3(tmp_path / "h", llama_dir, "speculators", aux_ids=[0, 1, 2])
        spec = {
            "adaptive_draft_length": False,
            "method": "eagle3",
            "model": head,
            "num_speculative_tokens": K,
            "tree_top_k": 2,
            "tree_nodes": 6,
        }
    sampled = [SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_tokens=12) for s in range(len(PROMPTS))]
    eager = LLM(llama_dir, dtype="float64", speculative_config=spec, max_num_seqs=2)
    backend = TreeGraphBackend()
    llm = LLM(llama_dir, dtype="float64", speculative_config=spec, backend=backend, max_num_seqs=2)
    assert llm.engine.captured is not None and llm.engine.captured.q == 7
    (runner,) = backend.runners
    assert runner.captured_sizes == (7, 14)  # multiples of the tree's 1 + nodes
    for params in (GREEDY, sampled):
        assert _ids(llm, params) == _ids(eager, params)
    assert runner.replays > 0 and llm.metrics.total.num_accepted_tokens > 0
    # the first tree step's scores: the replayed rows (real nodes first, then padding) are the eager ones
    seen: dict[str, list[torch.Tensor]] = {"eager": [], "graph": []}
    forward, replay = eager.engine.runner.forward, llm.engine.captured.forward

    def eager_spy(batch: Any, last_only: bool) -> Any:
        out = forward(batch, last_only)
        if batch.attention.tree is not None:
            seen["eager"].append(out.logits)
        return out

    eager.engine.runner.forward = eager_spy  # type: ignore[method-assign]
    llm.engine.captured.forward = lambda batch: seen["graph"].append(replay(batch).logits) or replay(batch)  # type: ignore[method-assign]
    for engine in (eager, llm):
        engine.generate([PROMPTS[0]], GREEDY)
    first = seen["eager"][0].float()  # the captured step returns float32 logits
    torch.testing.assert_close(seen["graph"][0][: first.shape[0]], first, atol=1e-6, rtol=0)
