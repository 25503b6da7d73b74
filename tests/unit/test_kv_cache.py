"""The ragged KV cache: batched ragged forwards and per-request rollback match unbatched transformers."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend.backends import load_backend
from spec_backend.runtime.kv_cache import KVLayout, RaggedKVCache, kv_layout, plan_num_slots
from spec_backend.runtime.loader import load_model, register_attention
from spec_backend.runtime.runner import ModelRunner
from spec_backend.runtime.sources import ModelSource
from spec_backend.step import StepBatch, build_step_batch
from spec_backend.tools.tiny import make_tiny_model


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


def make_runner(model: torch.nn.Module, max_len: int, slots: int) -> ModelRunner:
    layout = kv_layout(model.config, model.dtype, torch.device("cpu"))
    return ModelRunner(model, RaggedKVCache(layout, max_len, slots))


def step(cache: RaggedKVCache, start: int, seqs: list[list[int]]) -> StepBatch:
    """The StepBatch feeding ``seqs[b]`` to slot ``start + b`` after what it holds."""
    lens = [len(s) for s in seqs]
    tokens = torch.zeros((len(seqs), max(lens)), dtype=torch.int64)
    for b, seq in enumerate(seqs):
        tokens[b, : len(seq)] = torch.tensor(seq)
    return build_step_batch(start, tokens, lens, cache.lengths[start : start + len(seqs)])


def forward(runner: ModelRunner, start: int, seqs: list[list[int]], last_only: bool) -> torch.Tensor:
    return runner.forward(step(runner.cache, start, seqs), last_only).logits


def test_ragged_forward_and_rollback_match_unbatched(models: tuple) -> None:
    ours, ref = models
    runner = make_runner(ours, 600, 3)
    seqs = [[1, 5, 7, 9, 11], [3, 4], [8, 8, 8, 8, 8, 8, 8]]
    for _ in seqs:
        runner.cache.add_slot()
    logits = forward(runner, 0, seqs, last_only=True)  # [3, V] prefill
    for b, seq in enumerate(seqs):
        torch.testing.assert_close(logits[b], ref_logits(ref, seq, 1)[0], rtol=0, atol=1e-9)
    steps = [[13, 14, 15], [6], [2, 2]]
    logits = forward(runner, 0, steps, last_only=False)  # [6, V] request-major rows
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
    logits = forward(runner, 0, steps, last_only=False)
    row = 0
    for seq, new in zip(seqs, steps, strict=True):
        torch.testing.assert_close(
            logits[row : row + len(new)], ref_logits(ref, seq + new, len(new)), atol=1e-9, rtol=0
        )
        row += len(new)


def test_move_slot_keeps_contents_and_addresses_stay(models: tuple) -> None:
    ours, ref = models
    runner = make_runner(ours, 600, 2)
    addresses = [layer.keys.data_ptr() for layer in runner.cache.layers]
    long_prompt = [(i * 7) % 100 + 1 for i in range(300)]
    short = [4, 5, 6]
    runner.cache.add_slot()
    runner.cache.add_slot()
    forward(runner, 0, [short, long_prompt], last_only=True)
    runner.cache.move_slot(1, 0)  # request 0 leaves; request 1 moves into slot 0
    runner.cache.pop_slot()
    logits = forward(runner, 0, [[7, 8]], last_only=False)
    torch.testing.assert_close(logits, ref_logits(ref, [*long_prompt, 7, 8], 2), atol=1e-9, rtol=0)
    assert [layer.keys.data_ptr() for layer in runner.cache.layers] == addresses  # preallocated, never moved


LAYOUT = KVLayout(num_layers=2, num_kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))


def test_cache_bookkeeping_errors() -> None:
    cache = RaggedKVCache(LAYOUT, max_len=8, num_slots=1)
    slot = cache.add_slot()
    with pytest.raises(RuntimeError, match="all 1 KV cache slots are in use"):
        cache.add_slot()
    cache.begin_step(step(cache, 0, [[1, 2, 3]]))
    cache.end_step()
    assert cache.lengths == [3] and cache.get_seq_length() == 3
    with pytest.raises(ValueError, match="cannot truncate"):
        cache.truncate(slot, 4)
    with pytest.raises(ValueError, match="overflow"):
        cache.begin_step(step(cache, 0, [[1] * 6]))
    cache.crop(-2)
    assert cache.lengths == [1]
    with pytest.raises(RuntimeError, match="outside a step"):
        cache.layers[0].update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))


def test_positions_and_metadata_for_padded_batch() -> None:
    cache = RaggedKVCache(LAYOUT, max_len=64, num_slots=2)
    cache.add_slot()
    cache.add_slot()
    cache.begin_step(step(cache, 0, [[1] * 4, [1] * 2]))
    batch = step(cache, 0, [[1, 2, 3], [4]])
    assert batch.attention.query_lens.tolist() == [3, 1] and batch.attention.kv_lens.tolist() == [7, 3]
    assert batch.padded_positions().tolist() == [[4, 5, 6], [2, 2, 2]]  # padding repeats the last position
    assert batch.positions.tolist() == [4, 5, 6, 2] and batch.input_ids.tolist() == [1, 2, 3, 4]


def test_memory_budget_sizes_slots_and_refuses_too_little() -> None:
    per_slot = (
        LAYOUT.bytes_per_position * 100
    )  # 2 layers x (k, v) x 1 head x dim 2 x 4 bytes = 32 per position
    assert LAYOUT.bytes_per_position == 32
    assert plan_num_slots(per_slot, 100, 8, None) == 8
    assert plan_num_slots(per_slot, 100, 8, 3 * per_slot + 5) == 3
    with pytest.raises(
        ValueError, match=r"kv_cache_memory_bytes=3199 cannot hold one request of max_model_len=100"
    ):
        plan_num_slots(per_slot, 100, 8, per_slot - 1)
