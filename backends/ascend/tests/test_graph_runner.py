"""ACLGraph runner on the fake NPU: padding, slicing, eager fallback, shared pool, budget, and
attention lengths re-issued before every replay."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from helpers import reference
from spec_backend_ascend import GRAPH_STREAM_BUDGET, AscendBackend, StreamLedger
from spec_backend_ascend.attention import ascend_ragged_attention
from spec_backend_ascend.graph_runner import AclGraphRunner

from spec_backend.backends.base import BackendError
from spec_backend.graphs import plan_capture_sizes
from spec_backend.step import RaggedAttentionMetadata


def _events(fake: ModuleType, *names: str) -> list[str]:
    return [c[0] for c in fake.CALLS if c[0] in names]


def test_pads_to_next_size_slices_back_and_runs_eagerly_above(fake_npu: ModuleType) -> None:
    calls: list[int] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return x * 2 + 1

    runner = AscendBackend().graph_runner(fn, [8, 4])
    assert isinstance(runner, AclGraphRunner)
    runner.capture({"x": torch.zeros(8, 3)})
    assert runner.captured_sizes == (4, 8) and calls == [8, 8, 4, 4]  # warm-up + capture, largest first
    graphs = [c[1] for c in fake_npu.CALLS if c[0] == "capture_begin"]
    assert len({g.pool() for g in graphs}) == 1  # one memory pool shared by every size
    calls.clear()
    x = torch.arange(9.0).view(3, 3)
    out = runner.run({"x": x})  # 3 tokens -> the graph of size 4
    assert torch.equal(out, x * 2 + 1) and out.shape == (3, 3)
    assert calls == [] and graphs[1].replays == 1  # replayed, fn not called
    big = torch.ones(11, 3)
    assert torch.equal(runner.run({"x": big}), big * 2 + 1) and calls == [11]  # eager above 8
    out2 = runner.run({"x": torch.full((5, 3), 2.0)})  # 5 tokens -> size 8, static buffers reused
    assert torch.equal(out2, torch.full((5, 3), 5.0)) and graphs[0].replays == 1


def test_tuple_outputs_are_replayed_and_sliced_on_the_npu(fake_npu: ModuleType) -> None:
    """A callable returning (hidden [N, 3], ids [N]): both outputs come from the replayed graph."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 3, x.sum(-1).to(torch.int64)

    runner = AscendBackend().graph_runner(fn, [4, 8])
    runner.capture({"x": torch.zeros(8, 3)})
    assert isinstance(runner, AclGraphRunner) and runner._record(4).size == 4
    x = torch.arange(15.0).view(5, 3)
    out = runner.run({"x": x})  # 5 tokens -> the graph of size 8
    assert isinstance(out, tuple) and runner.replays == 1 and runner.eager_calls == 0
    assert torch.equal(out[0], x * 3) and torch.equal(out[1], x.sum(-1).to(torch.int64))
    big = torch.ones(9, 3)
    eager = runner.run({"x": big})
    assert isinstance(eager, tuple) and runner.eager_calls == 1 and torch.equal(eager[0], big * 3)


def test_replay_is_a_replay_not_a_rerun(fake_npu: ModuleType) -> None:
    """Host values read while capturing are frozen into the graph, as on the device."""
    scale = {"value": 2.0}
    runner = AclGraphRunner(lambda x: x * scale["value"], [4])
    runner.capture({"x": torch.zeros(4)})
    scale["value"] = 10.0
    assert torch.equal(runner.run({"x": torch.ones(2)}), torch.full((2,), 2.0))


def test_host_sync_inside_capture_is_rejected(fake_npu: ModuleType) -> None:
    runner = AclGraphRunner(lambda x: x * x.sum().item(), [2])
    with pytest.raises(RuntimeError, match="cannot be captured"):
        runner.capture({"x": torch.ones(2)})


def test_graph_budget_is_shared_by_every_runner_of_a_backend(fake_npu: ModuleType) -> None:
    """Whole-forward graphs take one stream each (a heuristic); the target's and the drafter's runners
    draw on one budget, so the second runner gets what the first left, never more."""
    backend = AscendBackend()
    backend.streams = StreamLedger(total=20)
    requested = [16 * n for n in range(1, 33)]  # 32 sizes
    target = backend.graph_runner(lambda x: x + 1, requested)
    assert len(target.capture_sizes) == 20 and target.capture_sizes[0] == 16
    assert target.capture_sizes[-1] == 512 and backend.capture_policy().graph_budget == 0
    target.capture({"x": torch.zeros(512)})
    assert _events(fake_npu, "capture_begin").count("capture_begin") == 20
    backend.streams = StreamLedger(total=20)
    target = backend.graph_runner(lambda x: x + 1, requested[:12])
    drafter = backend.graph_runner(lambda x: x * 2, requested)
    assert len(target.capture_sizes) == 12 and len(drafter.capture_sizes) == 8
    assert backend.capture_policy(61).graph_budget == 0  # depth does not change whole-forward graphs
    assert AscendBackend().capture_policy().graph_budget == GRAPH_STREAM_BUDGET


def test_running_out_of_streams_at_capture_says_what_to_lower(fake_npu: ModuleType) -> None:
    fake_npu._graph.STREAMS["limit"] = 3  # the device has fewer streams than the heuristic assumed
    runner = AscendBackend().graph_runner(lambda x: x + 1, [4, 8, 12, 16])
    with pytest.raises(
        BackendError, match=r"ran out of NPU stream resources \(error 207008\).*fewer capture sizes"
    ):
        runner.capture({"x": torch.zeros(16)})


def test_k15_plan_is_multiples_of_16_within_budget() -> None:
    backend = AscendBackend()
    backend.check_num_speculative_tokens(15)
    with pytest.raises(ValueError, match="at most 16 query tokens"):
        backend.check_num_speculative_tokens(16)
    for layers in (1, 32, 61, 200):
        sizes = plan_capture_sizes(15, 64, backend=backend, num_hidden_layers=layers)
        assert sizes and all(s % 16 == 0 and s <= 512 for s in sizes)
        assert len(sizes) <= backend.capture_policy(layers).graph_budget  # type: ignore[operator]


Q, HEADS, KV_HEADS, SLOTS, CACHE_LEN = 4, 4, 2, 3, 40
#: head dims of the captured attention: 16 takes the BNSD layout, 64 the TND one
DIMS = [16, 64]


def _attention_graph(gen: torch.Generator, dim: int) -> tuple[AclGraphRunner, dict[str, object]]:
    """A runner over one attention layer: tokens [T, Hq, D] -> [T, Hq, D] against a static cache."""
    state: dict[str, object] = {
        "k": torch.randn(SLOTS, KV_HEADS, CACHE_LEN, dim, generator=gen).half().float(),
        "v": torch.randn(SLOTS, KV_HEADS, CACHE_LEN, dim, generator=gen).half().float(),
    }

    def fn(query: torch.Tensor) -> torch.Tensor:
        batch = query.shape[0] // Q
        q = query.view(batch, Q, HEADS, dim).transpose(1, 2)  # [B, Hq, Q, D]
        full = torch.full((batch,), Q)
        meta = RaggedAttentionMetadata(full, torch.full((batch,), CACHE_LEN))  # eager warm-up only
        k, v = state["k"][:batch], state["v"][:batch]  # type: ignore[index]
        out, _ = ascend_ragged_attention(torch.nn.Module(), q, k, v, None, spec_attn_metadata=meta)
        return out.reshape(batch * Q, HEADS, dim)

    runner = AclGraphRunner(fn, [Q, 2 * Q, 3 * Q])
    runner.capture({"query": torch.zeros(3 * Q, HEADS, dim)})
    return runner, state


@pytest.mark.parametrize("dim", DIMS)
def test_attention_lengths_are_updated_before_every_replay(fake_npu: ModuleType, dim: int) -> None:
    gen = torch.Generator().manual_seed(3)
    runner, state = _attention_graph(gen, dim)
    assert [runner.attention_tasks(s) for s in runner.captured_sizes] == [1, 1, 1]
    steps = [([4, 2], [9, 30]), ([1, 3], [1, 40]), ([4], [12]), ([2, 4, 3], [5, 6, 33])]
    for query_lens, kv_lens in steps:
        meta = RaggedAttentionMetadata(torch.tensor(query_lens), torch.tensor(kv_lens))
        runner.set_update_hook(
            lambda size, inputs, m=meta: runner.update_attention(size, m.query_lens, m.kv_lens)
        )
        batch = len(query_lens)
        query = torch.randn(batch * Q, HEADS, dim, generator=gen).half().float()
        fake_npu.reset()
        got = runner.run({"query": query}).view(batch, Q, HEADS, dim)
        assert _events(fake_npu, "task_update", "event_record", "replay") == [
            "task_update",
            "event_record",
            "replay",
        ]
        k, v = state["k"][:batch, :, : max(kv_lens)], state["v"][:batch, :, : max(kv_lens)]  # type: ignore[index]
        want = reference(query.view(batch, Q, HEADS, dim).transpose(1, 2), k, v, meta)
        rows = torch.arange(Q)[None, :] < meta.query_lens[:, None]
        torch.testing.assert_close(got[rows], want[rows], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dim", DIMS)
def test_replay_without_update_is_refused(fake_npu: ModuleType, dim: int) -> None:
    runner, _ = _attention_graph(torch.Generator().manual_seed(4), dim)
    with pytest.raises(RuntimeError, match="updated before every replay"):
        runner.run({"query": torch.zeros(Q, HEADS, dim)})
    runner.set_update_hook(lambda size, inputs: None)  # a hook that forgets the attention lengths
    with pytest.raises(RuntimeError, match="register an update hook"):
        runner.run({"query": torch.zeros(Q, HEADS, dim)})
    graph = next(c[1] for c in fake_npu.CALLS if c[0] == "capture_begin")
    with pytest.raises(RuntimeError, match="never recorded"):  # the device graph itself would block
        graph.replay()
