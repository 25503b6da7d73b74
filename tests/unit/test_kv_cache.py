"""The ragged KV cache: batched ragged forwards and per-request rollback match unbatched transformers."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend.backends import load_backend
from spec_backend.engine.kv_cache import RaggedKVCache
from spec_backend.engine.loader import ModelSource, load_model, register_attention
from spec_backend.engine.runner import ModelRunner
from spec_backend.engine.tiny import make_tiny_model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    from transformers import AutoModelForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = make_tiny_model(
        tmp_path_factory.mktemp(request.param), request.param, max_position_embeddings=1024
    )
    name = register_attention(load_backend("reference"))
    ours = load_model(ModelSource(path), name, torch.float64, torch.device("cpu"))
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    yield ours, ref
    torch.set_num_threads(threads)


def ref_logits(ref: torch.nn.Module, seq: list[int], last: int) -> torch.Tensor:
    with torch.no_grad():
        return ref(torch.tensor([seq])).logits[0, -last:]  # [last, V]


def test_ragged_forward_and_rollback_match_unbatched(models: tuple) -> None:
    ours, ref = models
    runner = ModelRunner(ours, max_model_len=600, max_num_seqs=2, device=torch.device("cpu"))
    seqs = [[1, 5, 7, 9, 11], [3, 4], [8, 8, 8, 8, 8, 8, 8]]
    for _ in seqs:
        runner.cache.add_slot()
    logits = runner.forward(0, seqs, last_only=True)  # [3, V] prefill, slot capacity grows past 2
    for b, seq in enumerate(seqs):
        torch.testing.assert_close(logits[b], ref_logits(ref, seq, 1)[0], rtol=0, atol=1e-9)
    steps = [[13, 14, 15], [6], [2, 2]]
    logits = runner.forward(0, steps, last_only=False)  # [6, V] request-major rows
    row = 0
    for b, (seq, new) in enumerate(zip(seqs, steps, strict=True)):
        torch.testing.assert_close(
            logits[row : row + len(new)], ref_logits(ref, seq + new, len(new)), atol=1e-9, rtol=0
        )
        row += len(new)
        seqs[b] = seq + new
    assert runner.cache.lengths == [8, 3, 9]
    runner.cache.truncate(0, 6)  # reject the last two tokens of request 0
    seqs[0] = seqs[0][:6]
    steps = [[20, 21], [9, 10, 11], [5]]
    logits = runner.forward(0, steps, last_only=False)
    row = 0
    for seq, new in zip(seqs, steps, strict=True):
        torch.testing.assert_close(
            logits[row : row + len(new)], ref_logits(ref, seq + new, len(new)), atol=1e-9, rtol=0
        )
        row += len(new)


def test_move_slot_keeps_contents_and_capacity_grows(models: tuple) -> None:
    ours, ref = models
    runner = ModelRunner(ours, max_model_len=600, max_num_seqs=2, device=torch.device("cpu"))
    long_prompt = [(i * 7) % 100 + 1 for i in range(300)]  # beyond the initial 256-position capacity
    short = [4, 5, 6]
    runner.cache.add_slot()
    runner.cache.add_slot()
    runner.forward(0, [short, long_prompt], last_only=True)
    runner.cache.move_slot(1, 0)  # request 0 leaves; request 1 moves into slot 0
    runner.cache.pop_slot()
    logits = runner.forward(0, [[7, 8]], last_only=False)
    torch.testing.assert_close(logits, ref_logits(ref, [*long_prompt, 7, 8], 2), atol=1e-9, rtol=0)


def test_cache_bookkeeping_errors() -> None:
    cache = RaggedKVCache(num_layers=2, max_len=8)
    slot = cache.add_slot()
    cache.begin_step(0, [3], torch.device("cpu"))
    cache.end_step()
    assert cache.lengths == [3] and cache.get_seq_length() == 3
    with pytest.raises(ValueError, match="cannot truncate"):
        cache.truncate(slot, 4)
    with pytest.raises(ValueError, match="overflow"):
        cache.begin_step(0, [6], torch.device("cpu"))
    cache.crop(-2)
    assert cache.lengths == [1]
    with pytest.raises(RuntimeError, match="outside a step"):
        cache.layers[0].update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))


def test_positions_and_metadata_for_padded_batch() -> None:
    cache = RaggedKVCache(num_layers=1, max_len=64)
    cache.add_slot()
    cache.add_slot()
    cache.begin_step(0, [4, 2], torch.device("cpu"))
    meta, positions = cache.begin_step(0, [3, 1], torch.device("cpu"))
    assert meta.query_lens.tolist() == [3, 1] and meta.kv_lens.tolist() == [7, 3]
    assert positions.tolist() == [[4, 5, 6], [2, 2, 2]]  # padding rows repeat the last valid position
