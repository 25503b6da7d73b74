"""Token trees in the step (#42): a batched tree forward scores every node exactly as a plain forward of
the path to it would, on the reference attention (full and sliding-window layers); keeping the accepted
path compacts the cache so decoding continues as if only that path had been fed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from test_kv_cache import forward, make_runner, ref_logits

from spec_backend.backends import load_backend
from spec_backend.runtime.loader import load_model, register_attention
from spec_backend.runtime.runner import ModelRunner
from spec_backend.runtime.sources import ModelSource
from spec_backend.step import RaggedAttentionMetadata, build_tree_step_batch
from spec_backend.tools.tiny import make_tiny_model

#: per request: (prompt, the last committed token, tree parents, tree tokens)
TREES = [
    ([1, 5, 7, 9], 11, [-1, -1, 0, 0, 1, 2], [20, 21, 22, 23, 24, 25]),
    ([3, 4], 6, [-1, 0, 1], [30, 31, 32]),  # a chain
    ([8, 8, 8, 8, 8, 8], 2, [-1, -1, -1], [40, 41, 42]),  # a fan
    ([9, 10, 11], 12, [-1, -1, -1, -1, 3, 4, 5], [60, 61, 62, 63, 64, 65, 66]),  # a chain below a fan
]


@pytest.fixture(scope="module", params=["llama", "sliding"])
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    from transformers import AutoModelForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    extra: dict[str, Any] = {"max_position_embeddings": 1024}
    if request.param == "sliding":  # Qwen2 with sliding windows of 3 in every layer: depth, not column
        extra |= {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 0}
    path = make_tiny_model(
        tmp_path_factory.mktemp(request.param), "qwen2" if extra.get("sliding_window") else "llama", **extra
    )
    name = register_attention(load_backend("reference"))
    ours = load_model(ModelSource(path), name, torch.float64, torch.device("cpu"))
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    yield ours, ref
    torch.set_num_threads(threads)


def _path(parents: list[int], tokens: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]


def _tree_forward(runner: ModelRunner) -> torch.Tensor:
    width = 1 + max(len(t) for *_, t in TREES)
    ids = torch.zeros((len(TREES), width), dtype=torch.int64)
    for b, (_, last, _, tokens) in enumerate(TREES):
        ids[b, : 1 + len(tokens)] = torch.tensor([last, *tokens])
    parents = [p for _, _, p, _ in TREES]
    batch = build_tree_step_batch(0, ids, parents, runner.cache.lengths[: len(TREES)])
    return runner.forward(batch, last_only=False).logits  # [N, V]


def _prefilled(model: torch.nn.Module) -> ModelRunner:
    """A runner with one slot per tree, each holding its prompt."""
    runner = make_runner(model, 200, len(TREES))
    for _ in TREES:
        runner.cache.add_slot()
    forward(runner, 0, [prompt for prompt, *_ in TREES], last_only=True)
    return runner


def test_every_tree_node_scores_like_its_path(models: tuple) -> None:
    ours, ref = models
    runner = _prefilled(ours)
    logits, row = _tree_forward(runner), 0
    for prompt, last, parents, tokens in TREES:
        torch.testing.assert_close(logits[row], ref_logits(ref, [*prompt, last], 1)[0], atol=1e-9, rtol=0)
        for node in range(len(tokens)):
            want = ref_logits(ref, [*prompt, last, *_path(parents, tokens, node)], 1)[0]
            torch.testing.assert_close(logits[row + 1 + node], want, atol=1e-9, rtol=0, msg=f"node {node}")
        row += 1 + len(tokens)


def test_keeping_the_accepted_path_lets_decoding_continue(models: tuple) -> None:
    ours, ref = models
    runner = _prefilled(ours)
    _tree_forward(runner)
    kept = [
        [1, 3, 6],
        [1, 2],
        [3],
        [4, 5, 6, 7],
    ]  # columns of accepted nodes (column 0 is the committed token)
    for b, ((prompt, *_), cols) in enumerate(zip(TREES, kept, strict=True)):
        runner.cache.keep_path(b, len(prompt), [0, *cols])
        assert runner.cache.lengths[b] == len(prompt) + 1 + len(cols)
    nxt = [[50], [51], [52], [53]]
    logits = forward(runner, 0, nxt, last_only=False)
    for b, ((prompt, last, _, tokens), cols) in enumerate(zip(TREES, kept, strict=True)):
        seq = [*prompt, last, *(tokens[c - 1] for c in cols), *nxt[b]]
        torch.testing.assert_close(logits[b], ref_logits(ref, seq, 1)[0], atol=1e-9, rtol=0)


def test_bad_paths_and_trees_are_refused(models: tuple) -> None:
    runner = make_runner(models[0], 200, 1)
    runner.cache.add_slot()
    forward(runner, 0, [[1, 2, 3]], last_only=True)
    with pytest.raises(ValueError, match=r"starts at column 0 and increases, got \[0, 2, 1\]"):
        runner.cache.keep_path(0, 2, [0, 2, 1])
    with pytest.raises(ValueError, match=r"node 1 needs a parent in -1..0"):
        build_tree_step_batch(0, torch.zeros((1, 3), dtype=torch.int64), [[-1, 1]], [3])


def test_the_cpu_backend_applies_the_tree_mask() -> None:
    """A marked (batch-invariant) model's tree step: each row over the keys of its path, which is the
    reference's tree attention (bit-exactness against plain decoding: ``test_native_layer.py``)."""
    from spec_backend.backends.attention import sdpa_ragged_attention
    from spec_backend.cpu.attention import cpu_ragged_attention, mark_batch_invariant

    module = torch.nn.Linear(1, 1)
    mark_batch_invariant(module)
    tokens = torch.zeros((2, 4), dtype=torch.int64)
    batch = build_tree_step_batch(0, tokens, [[-1, -1, 0], [-1, 0]], [5, 2])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 4, 16, generator=gen)  # [B, Hq, Q, D]
    k, v = (
        torch.randn(2, 2, batch.max_seq_len, 16, generator=gen),
        torch.randn(2, 2, batch.max_seq_len, 16, generator=gen),
    )
    meta = batch.attention
    got, _ = cpu_ragged_attention(module, q, k, v, None, spec_attn_metadata=meta)
    want, _ = sdpa_ragged_attention(module, q, k, v, None, spec_attn_metadata=meta)
    real = torch.arange(4)[None, :] < meta.query_lens[:, None]  # [B, Q]
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)
    causal, _ = sdpa_ragged_attention(
        module, q, k, v, None, spec_attn_metadata=RaggedAttentionMetadata(meta.query_lens, meta.kv_lens)
    )
    assert not torch.allclose(causal[real], want[real], atol=1e-3)  # the tree mask matters here
