"""EAGLE-style heads' draft steps 2..K replayed from captured graphs (``proposers/captured_head.py``).

Over the strict simulated graph driver (a host read, or a tensor made from host data, inside a captured
callable raises, as a device graph refuses or freezes it), every step's drafts, and the greedy and seeded
sampled tokens, equal the eager engine's; the head's graphs are captured at 1, 2, … requests and
replayed, padded batches and requests admitted into padded slots included, over cache memory that
starts as NaN (as reused device memory may); on a backend that captures draft chains, argmax drafts
2..K come from one replay. An MTP head with several layers runs its draft steps eagerly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import PROMPTS, record_drafts
from test_engine_graphs import SimulatedGraphBackend

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.captured_head import CapturedHeadStep
from spec_backend.proposers.eagle import EagleDrafter
from spec_backend.testing.fixtures import draft_checkpoints as w
from spec_backend.tools.tiny import make_tiny_model

K = 3
GREEDY = SamplingParams(temperature=0.0, max_tokens=14)
SAMPLED = [SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_tokens=12) for s in range(len(PROMPTS))]


class ChainGraphBackend(SimulatedGraphBackend):
    """The strict simulated graphs on a backend whose captured attention reads device lengths."""

    captures_draft_chains = True


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("head-graphs"), "llama")


def _spec(method: str, llama_dir: str, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """The target folder and speculative config of ``method`` (a tiny checkpoint in its real format)."""
    if method.startswith("mtp"):
        from test_drafter_mtp import write_glm_with_mtp

        target = write_glm_with_mtp(tmp_path / "glm", nextn=2 if method == "mtp2" else 1)
        k = 4 if method == "mtp2" else K  # a multiple of the layers: draft steps 1, 2, 3 run layers 1, 0, 1
        return target, {"method": "mtp", "num_speculative_tokens": k}
    head = {
        "eagle": lambda: w.write_eagle1(tmp_path / "h", llama_dir, bias=True),
        "eagle3": lambda: w.write_eagle3(
            tmp_path / "h", llama_dir, "speculators", draft_vocab=64, aux_ids=[0, 1, 2]
        ),
    }[method]()
    return llama_dir, {"method": method, "model": head, "num_speculative_tokens": K}


def _ids(llm: LLM, params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


def _record_steps(llm: LLM) -> list[tuple[list[list[int]], list[int]]]:
    """Wrap ``llm``'s drafter: each step's drafts of every request (cut to its count) and the drafter
    cache's host lengths after it."""
    seen: list[tuple[list[list[int]], list[int]]] = []
    drafter: Any = llm.engine.drafter
    propose = drafter.propose

    def spy(inputs: Any) -> Any:
        out = propose(inputs)
        rows = [row[:n] for row, n in zip(out.token_ids.tolist(), out.num_draft_tokens, strict=True)]
        seen.append((rows, list(drafter.caches()[0].lengths)))
        return out

    drafter.propose = spy
    return seen


def _step_graph(llm: LLM) -> CapturedHeadStep:
    drafter = llm.engine.drafter
    assert isinstance(drafter, EagleDrafter) and drafter.step_graph is not None
    return drafter.step_graph


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_draft_steps_replay_and_give_the_eager_drafts_and_tokens(
    llama_dir: str, tmp_path: Path, method: str
) -> None:
    target, spec = _spec(method, llama_dir, tmp_path)
    spec |= {"adaptive_draft_length": False}
    eager = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=2)
    backend = SimulatedGraphBackend()
    llm = LLM(target, dtype="float64", speculative_config=spec, backend=backend, max_num_seqs=2)
    graph = _step_graph(llm)
    assert graph.capture_sizes == [1, 2]  # one row per request, up to max_num_seqs
    drafts = record_drafts(eager), record_drafts(llm)
    assert _ids(llm, GREEDY) == _ids(eager, GREEDY)
    assert drafts[0] == drafts[1] and len(drafts[0]) > 1
    assert _ids(llm, SAMPLED) == _ids(eager, SAMPLED)
    runner: Any = graph.graph
    assert runner.replays > 0 and runner.eager_calls == 0  # max_num_seqs=2: every batch fits a graph


def test_padded_replays_and_admissions_into_padded_slots_over_nan_memory(
    llama_dir: str, tmp_path: Path
) -> None:
    """Four slots, six requests of different lengths: batches of 3 replay the graph of 4 (a padding request
    writes a free slot), batches of 1 replay the graph of 1, and later requests are admitted into slots
    padding rows wrote; every ``torch.empty`` (the caches included) starts as NaN. Drafts and tokens equal
    the eager engine's (fails without zeroing the head's cache at capture: its never-written positions
    would reach attention as NaN)."""
    target, spec = _spec("eagle3", llama_dir, tmp_path)
    spec |= {"adaptive_draft_length": False}
    prompts = [*PROMPTS, [7, 8, 9, 7, 8], [60, 61, 60, 61, 60, 61]]
    params = [SamplingParams(temperature=0.0, max_tokens=5 + 4 * i) for i in range(len(prompts))]
    deterministic = torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        eager = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=4)
        llm = LLM(
            target, dtype="float64", speculative_config=spec, backend=SimulatedGraphBackend(), max_num_seqs=4
        )
        sizes: list[int] = []
        runner: Any = _step_graph(llm).graph
        run = runner.run
        runner.run = lambda inputs: sizes.append(inputs["input_ids"].shape[0]) or run(inputs)
        drafts = record_drafts(eager), record_drafts(llm)
        outs = [[o.outputs[0].token_ids for o in e.generate(prompts, params)] for e in (eager, llm)]
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
    assert outs[0] == outs[1] and drafts[0] == drafts[1]
    assert {1, 3} <= set(sizes) and runner.eager_calls == 0  # 3 replays size 4: one padding request


def test_a_multi_layer_mtp_head_drafts_eagerly(tmp_path: Path) -> None:
    """Two MTP layers (draft steps alternate them): its second layer attends over rows only it writes,
    which a capture's or a padding request's rows would change for the next request in a slot, so its
    draft steps are not captured; tokens equal eager."""
    target, spec = _spec("mtp2", "", tmp_path)
    spec |= {"adaptive_draft_length": False}
    llm = LLM(target, dtype="float64", speculative_config=spec, backend=ChainGraphBackend(), max_num_seqs=2)
    drafter = llm.engine.drafter
    assert isinstance(drafter, EagleDrafter) and drafter.step_graph is None
    eager = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=2)
    assert _ids(llm, GREEDY) == _ids(eager, GREEDY)


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_a_greedy_chain_is_one_replay_with_the_eager_drafts(
    llama_dir: str, tmp_path: Path, method: str
) -> None:
    """Drafts 2..K from one replay (K-1 forwards and argmaxes over lengths growing on the device) are
    the eager drafts; the tokens of greedy and seeded sampled requests too. A step drafting fewer (a
    request near ``max_tokens``) replays the one-row graphs instead."""
    target, spec = _spec(method, llama_dir, tmp_path)
    spec |= {"adaptive_draft_length": False}
    eager = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=2)
    llm = LLM(target, dtype="float64", speculative_config=spec, backend=ChainGraphBackend(), max_num_seqs=2)
    graph = _step_graph(llm)
    assert graph.chain == spec["num_speculative_tokens"] - 1 and graph.chain_graph is not None
    steps = _record_steps(eager), _record_steps(llm)
    assert _ids(llm, GREEDY) == _ids(eager, GREEDY)
    assert steps[0] == steps[1]  # every request's drafts, and the host lengths the chain reserved
    assert any(len(d) < spec["num_speculative_tokens"] for rows, _ in steps[0] for d in rows if d)
    assert _ids(llm, SAMPLED) == _ids(eager, SAMPLED)
    chain: Any = graph.chain_graph
    step: Any = graph.graph
    assert chain.replays > 0 and chain.eager_calls == 0
    assert step.replays > 0  # the shorter steps


def test_a_draft_models_greedy_chain_is_one_replay_with_the_eager_drafts(
    llama_dir: str, tmp_path: Path
) -> None:
    """A draft model's drafts 2..K from one replay of K-1 one-token forwards and argmaxes equal its eager
    drafts, and the tokens; probabilistic drafting keeps one replay per draft step."""
    draft = make_tiny_model(str(tmp_path), "qwen2", seed=9)  # its drafts move with positions
    spec: dict[str, Any] = {"method": "draft_model", "model": draft, "num_speculative_tokens": K}
    spec |= {"adaptive_draft_length": False}
    eager = LLM(llama_dir, dtype="float64", speculative_config=spec, max_num_seqs=2)
    llm = LLM(
        llama_dir, dtype="float64", speculative_config=spec, backend=ChainGraphBackend(), max_num_seqs=2
    )
    drafter: Any = llm.engine.drafter
    assert drafter.chain_graph is not None and drafter.chain_graph.chain == K - 1
    steps = _record_steps(eager), _record_steps(llm)
    assert _ids(llm, GREEDY) == _ids(eager, GREEDY) and _ids(llm, SAMPLED) == _ids(eager, SAMPLED)
    assert steps[0] == steps[1]  # every request's drafts, and the host lengths the chain reserved
    assert any(len(d) < K for rows, _ in steps[0] for d in rows if d)
    assert drafter.chain_graph.graph.replays > 0 and drafter.chain_graph.graph.eager_calls == 0
    assert drafter.decode_graph.graph.replays > 0  # the shorter steps
    spec |= {"rejection_sample_method": "probabilistic"}
    sampled = LLM(
        llama_dir, dtype="float64", speculative_config=spec, backend=ChainGraphBackend(), max_num_seqs=2
    )
    drafter = sampled.engine.drafter
    assert drafter.decode_graph is not None and drafter.chain_graph is None
    eager = LLM(llama_dir, dtype="float64", speculative_config=spec, max_num_seqs=2)
    assert _ids(sampled, SAMPLED) == _ids(eager, SAMPLED)
    spec |= {"rejection_sample_method": "strict", "speculative_token_tree": "[(0,), (1,), (0, 0), (0, 0, 0)]"}
    tree = LLM(
        llama_dir, dtype="float64", speculative_config=spec, backend=ChainGraphBackend(), max_num_seqs=2
    )
    assert tree.engine.drafter.chain_graph is None  # type: ignore[union-attr]  # trees draft no chain


def test_probabilistic_drafts_replay_too(llama_dir: str, tmp_path: Path) -> None:
    """Drafts sampled from the head (draft probabilities to the sampler): seeded tokens as eager."""
    target, spec = _spec("eagle3", llama_dir, tmp_path)
    spec |= {"adaptive_draft_length": False, "rejection_sample_method": "probabilistic"}
    eager = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=2)
    llm = LLM(
        target, dtype="float64", speculative_config=spec, backend=SimulatedGraphBackend(), max_num_seqs=2
    )
    drafts = record_drafts(eager), record_drafts(llm)
    assert _ids(llm, SAMPLED) == _ids(eager, SAMPLED)
    assert drafts[0] == drafts[1] and len(drafts[0]) > 1  # the same draws from the same distributions
    assert _step_graph(llm).graph.replays > 0  # type: ignore[attr-defined]
    chained = LLM(
        target, dtype="float64", speculative_config=spec, backend=ChainGraphBackend(), max_num_seqs=2
    )
    assert _step_graph(chained).chain_graph is None  # sampled drafts: one replay per draft step


def test_no_graphs_for_one_draft_eager_engines_parallel_drafting_or_trees(
    llama_dir: str, tmp_path: Path
) -> None:
    """Nothing to capture with K = 1; ``enforce_eager`` captures nothing; P-EAGLE drafts every draft in
    one forward and a token tree feeds levels, not one row per request."""
    target, spec = _spec("eagle3", llama_dir, tmp_path)
    cases = [
        ({**spec, "num_speculative_tokens": 1}, False),
        (spec, True),
        ({**spec, "tree_top_k": 2, "tree_nodes": 6}, False),
    ]
    for config, eager in cases:
        llm = LLM(target, speculative_config=config, backend=SimulatedGraphBackend(), enforce_eager=eager)
        drafter = llm.engine.drafter
        assert isinstance(drafter, EagleDrafter) and drafter.step_graph is None, config
    peagle = w.write_eagle3(tmp_path / "p", llama_dir, "peagle", aux_ids=[0, 1, 2])
    config = {"method": "eagle3", "model": peagle, "num_speculative_tokens": K, "parallel_drafting": True}
    llm = LLM(target, speculative_config=config, backend=SimulatedGraphBackend())
    drafter = llm.engine.drafter
    assert isinstance(drafter, EagleDrafter) and drafter.step_graph is None


def test_a_batch_not_covering_every_live_slot_runs_eagerly(llama_dir: str, tmp_path: Path) -> None:
    """Padding requests take the slots after a replayed batch, so only a batch from slot 0 over every live
    slot replays: a request retried alone while others run (a failing step's isolation) drafts eagerly
    rather than writing padding rows into a live request's slot."""
    target, spec = _spec("eagle", llama_dir, tmp_path)
    llm = LLM(
        target, dtype="float64", speculative_config=spec, backend=SimulatedGraphBackend(), max_num_seqs=4
    )
    graph = _step_graph(llm)
    for request in llm.make_requests(PROMPTS, GREEDY):
        llm.engine.add(request)
    llm.engine.step()
    live = len(PROMPTS)
    assert len(llm.engine.running) == live and live > 1
    assert graph.covers(0, live) and not graph.covers(0, 1) and not graph.covers(1, live - 1)
    drafter = llm.engine.drafter
    assert isinstance(drafter, EagleDrafter)
    tokens = torch.zeros((1, 1), dtype=torch.int64)  # [1, 1]
    batch = drafter.step_batch(0, tokens, [1])
    with pytest.raises(ValueError, match="one row per request over every live slot"):
        graph.forward(batch, tokens, torch.zeros((1, 1, 32), dtype=torch.float64))
