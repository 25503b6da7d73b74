"""GPU tier: every drafter on the CUDA backend with graphs captured — greedy speculative output equals
greedy plain output, and equals the same engine run eagerly (graphs off), token for token.

Drafter checkpoints are the tiny random ones in the published on-disk formats
(``spec_backend.testing.fixtures.draft_checkpoints``); they prove the paths run and stay lossless on the
GPU, not acceptance. float32 throughout (matrix products without TF32, torch's default), so plain and verify
forwards agree up to rounding that the tiny models' sharpened logits do not tie on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from cuda_testlib import tree_spec
from spec_backend_cuda import CudaBackend

from spec_backend.backends.base import GraphFn, GraphRunner

pytestmark = pytest.mark.cuda
os.environ.setdefault("HF_HUB_OFFLINE", "1")

K = 3
PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6],
    [40, 41, 42],
    [11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13],
    [90, 3, 90, 3, 90],
]


class RecordingCudaBackend(CudaBackend):
    """The CUDA backend, keeping every graph runner it makes (to count replays)."""

    def __init__(self, enforce_eager: bool = False) -> None:
        super().__init__(enforce_eager=enforce_eager, graph_progress=False)
        self.runners: list[GraphRunner] = []

    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        runner = super().graph_runner(fn, capture_sizes)
        self.runners.append(runner)
        return runner


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("transformers")
    from spec_backend.tools.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("target"), "llama")


def _spec(method: str, target_dir: str, tmp: Path) -> tuple[dict[str, Any], str]:
    """The speculative config of ``method`` (writing its checkpoint) and the target it runs on."""
    from spec_backend.testing.fixtures import draft_checkpoints as w
    from spec_backend.tools.tiny import make_tiny_model

    free: dict[str, dict[str, Any]] = {
        "ngram": {"prompt_lookup_max": 3, "prompt_lookup_min": 1},
        "ngram_gpu": {"prompt_lookup_max": 3, "prompt_lookup_min": 1},
        "suffix": {"suffix_decoding_min_token_prob": 0.0},
    }
    if method in free:
        return {"method": method, "num_speculative_tokens": K, **free[method]}, target_dir
    if method == "mtp":
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "unit"))
        from test_drafter_mtp import write_glm_with_mtp

        return {"method": "mtp", "num_speculative_tokens": K}, write_glm_with_mtp(tmp / "glm", nextn=1)
    if method == "dspark":
        from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark

        head = write_dspark(tmp / "dspark", target_dir, markov="rnn", block_size=4)
        return {"method": "dspark", "model": head, "num_speculative_tokens": K}, target_dir
    if method == "dflash2":
        deep = make_tiny_model(tmp / "deep", "llama", num_hidden_layers=6, seed=5)
        head = w.write_dflash2(tmp / "dflash2", deep)
        return {"method": "dflash", "model": head, "num_speculative_tokens": K}, deep
    writers: dict[str, Callable[[], str]] = {
        "draft_model": lambda: make_tiny_model(str(tmp / "draft"), "qwen2", seed=4),
        "eagle": lambda: w.write_eagle1(tmp / "h", target_dir, bias=True),
        "eagle3": lambda: w.write_eagle3(
            tmp / "h", target_dir, "speculators", draft_vocab=64, aux_ids=[0, 1, 2]
        ),
        "peagle": lambda: w.write_eagle3(tmp / "h", target_dir, "peagle", aux_ids=[0, 1, 2]),
        "dflash": lambda: w.write_dflash(tmp / "h", target_dir, target_layer_ids=[0, 1]),
        "medusa": lambda: w.write_medusa(tmp / "h", 32, 128, K, "vllm"),
        "mlp_speculator": lambda: w.write_mlp_speculator(tmp / "h", 32, 128, 48, K, tied=False),
    }
    name = {"peagle": "eagle3"}.get(method, method)
    return {"method": name, "model": writers[method](), "num_speculative_tokens": K}, target_dir


def _generate(target_dir: str, spec: dict[str, Any] | None, backend: CudaBackend) -> list[list[int]]:
    from spec_backend.engine import LLM, SamplingParams

    llm = LLM(
        target_dir,
        speculative_config=spec,
        backend=backend,
        dtype="float32",
        max_num_seqs=4,
        log_stats_interval=None,
    )
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=20))
    assert all(o.outputs[0].finish_reason != "error" for o in outs), [o.outputs[0].error for o in outs]
    return [list(o.outputs[0].token_ids) for o in outs]


METHODS = [
    "ngram",
    "ngram_gpu",
    "suffix",
    "draft_model",
    "eagle",
    "eagle3",
    "peagle",
    "dflash",
    "dflash2",
    "dspark",
    "mtp",
    "medusa",
    "mlp_speculator",
]


@pytest.mark.parametrize("method", METHODS)
def test_drafter_with_graphs_equals_plain_and_eager(target: str, tmp_path: Path, method: str) -> None:
    spec, target_dir = _spec(method, target, tmp_path)
    plain = _generate(target_dir, None, CudaBackend(graph_progress=False))
    graphs = RecordingCudaBackend()
    with_graphs = _generate(target_dir, spec, graphs)
    eager = _generate(target_dir, spec, RecordingCudaBackend(enforce_eager=True))
    assert graphs.runners, "no graph was captured"
    replays = sum(int(getattr(r, "replays", 0)) for r in graphs.runners)
    assert replays > 0, "captured graphs were never replayed"
    assert with_graphs == plain
    assert eager == plain


@pytest.mark.parametrize("method", ["dspark", "eagle3", "eagle3-dynamic"])
def test_token_trees_equal_plain_on_the_gpu(target: str, tmp_path: Path, method: str) -> None:
    """A branching tree (DSpark; EAGLE-3 with the head's own tree attention, static and dynamic) on the
    CUDA backend: tree verify steps go through SDPA, captured as graphs; greedy output equals plain
    decoding."""
    spec = tree_spec(method, target, tmp_path, K, "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]", 6)
    plain = _generate(target, None, CudaBackend(graph_progress=False))
    assert _generate(target, spec, CudaBackend(graph_progress=False)) == plain


@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3", "mtp"])
def test_greedy_draft_chains_replay_on_the_gpu(target: str, tmp_path: Path, method: str) -> None:
    """K drafts every step (adaptive drafting off): drafts 2..K replay the drafter's captured greedy chain
    (``captures_draft_chains``: K-1 forwards over lengths growing on the device), and the output equals
    plain decoding's and the eager engine's."""
    spec, target_dir = _spec(method, target, tmp_path)
    spec |= {"adaptive_draft_length": False}
    plain = _generate(target_dir, None, CudaBackend(graph_progress=False))
    graphs = RecordingCudaBackend()
    assert graphs.captures_draft_chains
    with_graphs = _generate(target_dir, spec, graphs)
    assert with_graphs == plain == _generate(target_dir, spec, RecordingCudaBackend(enforce_eager=True))
    chains = [r for r in graphs.runners if getattr(getattr(r, "fn", None), "__name__", "") == "_chain"]
    assert chains and sum(int(getattr(r, "replays", 0)) for r in chains) > 0, "no chain replayed"
