"""GPU tier: CUDA-graph replay equals eager for every captured and padded size; one shared pool; a
drafter's K-step loop as one graph; host values frozen at capture; eager above the largest size."""

from __future__ import annotations

import pytest
import torch
from spec_backend_cuda import CudaBackend
from spec_backend_cuda.graph_runner import CudaGraphRunner

from spec_backend.backends.reference import EagerGraphRunner
from spec_backend.graphs import plan_capture_sizes

pytestmark = pytest.mark.cuda


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda()


@pytest.mark.parametrize("k", [1, 3, 7])
def test_replay_equals_eager_for_every_size_and_padded_size(k: int) -> None:
    mlp = _mlp()
    sizes = plan_capture_sizes(k, max_num_seqs=16, backend=CudaBackend())
    assert all(s % (k + 1) == 0 for s in sizes)

    def fn(hidden: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:  # [N, 64], [N] -> [N, 64]
        return mlp(hidden) * scale[:, None]

    runner = CudaBackend(graph_progress=False).graph_runner(fn, sizes)
    assert isinstance(runner, CudaGraphRunner)
    largest = sizes[-1]
    runner.capture(
        {"hidden": torch.zeros(largest, 64, device="cuda"), "scale": torch.ones(largest, device="cuda")}
    )
    assert runner.captured_sizes == tuple(sizes)
    with torch.no_grad():
        for n in [*sizes, *(s - 1 for s in sizes if s > 1), largest + 1, largest + k + 1]:
            hidden, scale = torch.randn(n, 64, device="cuda"), torch.rand(n, device="cuda")
            got, want = runner.run({"hidden": hidden, "scale": scale}), fn(hidden, scale)
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # padded sizes may tile GEMMs apart
    assert runner.eager_calls == 2


def test_every_graph_shares_one_pool_and_captures_largest_first() -> None:
    order: list[int] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing():
            order.append(x.shape[0])
        return x * 2

    runner = CudaGraphRunner(fn, [4, 16, 8], progress=True)
    runner.capture({"x": torch.zeros(16, device="cuda")})
    assert order == [16, 8, 4]
    pools = {graph.pool() for graph in runner._graphs.values()}  # type: ignore[attr-defined]
    assert pools == {runner.pool}


def test_replay_is_a_replay_not_a_rerun() -> None:
    scale = {"value": 2.0}
    runner = CudaGraphRunner(lambda x: x * scale["value"], [4], progress=False)
    runner.capture({"x": torch.zeros(4, device="cuda")})
    scale["value"] = 10.0
    assert torch.equal(runner.run({"x": torch.ones(3, device="cuda")}), torch.full((3,), 2.0, device="cuda"))


def test_a_k_step_drafter_loop_is_captured_as_one_graph() -> None:
    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 512)).cuda()
    k = 4

    def draft(tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:  # [N], [N, 64] -> [N, K]
        out = []
        for _ in range(k):  # unrolled into the graph: K forwards, one replay
            hidden = torch.tanh(head[0](tokens) + hidden)
            tokens = head[1](hidden).argmax(dim=-1)
            out.append(tokens)
        return torch.stack(out, dim=1)

    runner = CudaGraphRunner(draft, [1, 2, 4, 8, 16], progress=False)
    runner.capture(
        {
            "tokens": torch.zeros(16, dtype=torch.long, device="cuda"),
            "hidden": torch.zeros(16, 64, device="cuda"),
        }
    )
    with torch.no_grad():
        for n in (1, 3, 8, 13, 16, 20):
            tokens = torch.randint(0, 512, (n,), device="cuda")
            hidden = torch.randn(n, 64, device="cuda")
            assert torch.equal(runner.run({"tokens": tokens, "hidden": hidden}), draft(tokens, hidden)), n
    assert runner.replays == 5 and runner.eager_calls == 1


def test_enforce_eager_never_captures() -> None:
    backend = CudaBackend(enforce_eager=True)
    runner = backend.graph_runner(lambda x: x + 1, [4])
    assert isinstance(runner, EagerGraphRunner)
    runner.capture({"x": torch.zeros(4, device="cuda")})
    assert torch.equal(runner.run({"x": torch.zeros(9, device="cuda")}), torch.ones(9, device="cuda"))


def test_capture_policy_uses_free_memory() -> None:
    free = torch.cuda.mem_get_info()[0]
    policy = CudaBackend().capture_policy()
    assert 16 <= policy.max_capture_size <= 512 and policy.graph_budget is None
    assert policy.max_capture_size == min(512, max(16, (free >> 30) * 64))


def test_tuple_outputs_replay_and_slice_every_output() -> None:
    mlp = _mlp()

    def fn(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [N, 64] -> [N, 64], [N] int64
        out = mlp(hidden)
        return out, out.argmax(-1)

    runner = CudaBackend(graph_progress=False).graph_runner(fn, [4, 8])
    runner.capture({"hidden": torch.zeros(8, 64, device="cuda")})
    with torch.no_grad():
        for n in (3, 8, 9):
            hidden = torch.randn(n, 64, device="cuda")
            got, want = runner.run({"hidden": hidden}), fn(hidden)
            assert isinstance(got, tuple) and [t.shape[0] for t in got] == [n, n]
            torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
            assert got[1].dtype == torch.int64
    assert runner.replays == 2 and runner.eager_calls == 1  # type: ignore[attr-defined]


def test_a_started_host_copy_holds_the_values_queued_before_it() -> None:
    """``CudaBackend.start_host_copy`` (``reads_early``): the copy is queued when started, so work queued
    after it (the next step launched ahead) changes neither what it returns nor what its wait waits for."""
    backend = CudaBackend()
    assert backend.reads_early
    values = torch.arange(6, dtype=torch.int64, device="cuda").view(2, 3)  # [2, 3]
    wait = backend.start_host_copy(values)
    values.add_(100)  # queued after the copy
    host = wait()
    assert host.device.type == "cpu" and host.is_pinned()
    assert host.tolist() == [[0, 1, 2], [3, 4, 5]]
