"""The padded graph runner on CPU through the simulated driver: padding, zeroed tails, slicing,
eager fallback, largest-first capture into one pool, validation; the CUDA runner's refusals."""

from __future__ import annotations

import pytest
import torch
from spec_backend_cuda import CudaBackend
from spec_backend_cuda.graph_runner import CudaGraphRunner

from spec_backend.backends import BackendError
from spec_backend.backends.graph_common import PaddedGraphRunner, SimulatedGraphDriver
from spec_backend.backends.reference import EagerGraphRunner
from spec_backend.graphs import plan_capture_sizes


def _runner(
    fn: object, sizes: list[int], **options: object
) -> tuple[PaddedGraphRunner, SimulatedGraphDriver]:
    driver = SimulatedGraphDriver()
    return PaddedGraphRunner(fn, sizes, driver, progress=False, **options), driver  # type: ignore[arg-type]


def test_pads_to_the_next_size_slices_back_and_runs_eagerly_above() -> None:
    seen: list[int] = []

    def fn(x: torch.Tensor) -> torch.Tensor:  # [N, 3] -> [N, 3]
        seen.append(x.shape[0])
        return x * 2 + 1

    runner, driver = _runner(fn, [8, 4])
    runner.capture({"x": torch.zeros(8, 3)})
    assert runner.captured_sizes == (4, 8)
    assert seen == [8, 8, 8, 4, 4, 4]  # 2 warm-ups + capture per size, largest first
    captures = [e[1] for e in driver.events if e[0] == "capture"]
    assert [c[0] for c in captures] == [8, 4] and len({c[1] for c in captures}) == 1  # one pool
    seen.clear()
    x = torch.arange(9.0).view(3, 3)
    out = runner.run({"x": x})  # 3 tokens -> graph of size 4
    assert out.shape == (3, 3) and torch.equal(out, x * 2 + 1) and seen == [4]
    assert runner.replays == 1 and runner.eager_calls == 0
    big = torch.ones(11, 3)
    assert torch.equal(runner.run({"x": big}), big * 2 + 1) and seen[-1] == 11 and runner.eager_calls == 1
    assert torch.equal(runner.run({"x": torch.full((5, 3), 2.0)}), torch.full((5, 3), 5.0))  # size 8


def test_the_padding_tail_is_zeroed_every_call() -> None:
    runner, _ = _runner(lambda x: x.clone(), [4, 8])
    runner.capture({"x": torch.zeros(8, 2)})
    runner.run({"x": torch.full((7, 2), 9.0)})  # fills rows 0..6 of the buffer
    runner.run({"x": torch.ones(3, 2)})  # size 4: rows 3.. must not keep the 9s
    buffer = runner.static_inputs["x"]
    assert torch.equal(buffer[:3], torch.ones(3, 2)) and torch.equal(buffer[3:4], torch.zeros(1, 2))


def test_every_planned_size_and_every_padded_size_equals_eager() -> None:
    k = 3
    sizes = plan_capture_sizes(k, max_num_seqs=16, backend=CudaBackend())
    assert sizes == [4, 8, 16, 32, 64] and all(s % (k + 1) == 0 for s in sizes)
    weight = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))

    def fn(h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # [N, 6], [N] -> [N, 6]
        return torch.tanh(h @ weight) + pos[:, None].float()

    runner, _ = _runner(fn, sizes)
    runner.capture({"h": torch.zeros(64, 6), "pos": torch.zeros(64, dtype=torch.long)})
    for n in range(1, 70):
        h, pos = torch.randn(n, 6), torch.arange(n)
        torch.testing.assert_close(runner.run({"h": h, "pos": pos}), fn(h, pos), rtol=0, atol=0)
    assert runner.replays == 64 and runner.eager_calls == 5


def test_a_k_step_drafter_loop_is_one_captured_callable() -> None:
    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))
    k = 4

    def draft(tokens: torch.Tensor) -> torch.Tensor:  # [N] -> [N, K]: K greedy steps
        out = []
        for _ in range(k):
            tokens = head(tokens).argmax(dim=-1)
            out.append(tokens)
        return torch.stack(out, dim=1)

    runner, _ = _runner(draft, [2, 4, 8])
    runner.capture({"tokens": torch.zeros(8, dtype=torch.long)})
    for n in (1, 2, 3, 5, 8):
        tokens = torch.randint(0, 32, (n,))
        assert torch.equal(runner.run({"tokens": tokens}), draft(tokens))


def test_inputs_that_do_not_match_the_capture_are_refused() -> None:
    runner, _ = _runner(lambda x, y: x + y, [4])
    runner.capture({"x": torch.zeros(4, 2), "y": torch.zeros(4, 2)})
    with pytest.raises(ValueError, match="differ from the captured inputs"):
        runner.run({"x": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="share their leading"):
        runner.run({"x": torch.zeros(2, 2), "y": torch.zeros(3, 2)})
    with pytest.raises(ValueError, match=r"captured for torch\.float32"):
        runner.run({"x": torch.zeros(2, 2, dtype=torch.float64), "y": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match=r"captured for torch.float32 \[N, 2\]"):
        runner.run({"x": torch.zeros(2, 5), "y": torch.zeros(2, 5)})


def test_capture_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="has 2 rows, the largest capture size needs 4"):
        _runner(lambda x: x, [4])[0].capture({"x": torch.zeros(2)})
    with pytest.raises(ValueError, match="leading dimension must be the token count"):
        _runner(lambda x: x.sum(0, keepdim=True), [4])[0].capture({"x": torch.zeros(4)})
    with pytest.raises(TypeError, match=r"must return one tensor or a non-empty tuple of tensors, got list"):
        _runner(lambda x: [x, x], [4])[0].capture({"x": torch.zeros(4)})
    with pytest.raises(TypeError, match=r"non-empty tuple of tensors, got tuple\(Tensor, int\)"):
        _runner(lambda x: (x, 1), [4])[0].capture({"x": torch.zeros(4)})
    with pytest.raises(
        ValueError, match=r"output 1's leading dimension must be the token count 4, got shape \[1\]"
    ):
        _runner(lambda x: (x, x.sum(0, keepdim=True)), [4])[0].capture({"x": torch.zeros(4)})
    runner, _ = _runner(lambda x: x, [4])
    runner.capture({"x": torch.zeros(4)})
    with pytest.raises(RuntimeError, match="already captured"):
        runner.capture({"x": torch.zeros(4)})
    with pytest.raises(ValueError, match="at least one capture size"):
        _runner(lambda x: x, [])


def test_before_capture_and_without_copies() -> None:
    runner, _ = _runner(lambda x: x + 1, [4], copy_output=False)
    assert torch.equal(runner.run({"x": torch.zeros(3)}), torch.ones(3)) and runner.eager_calls == 1
    runner.capture({"x": torch.zeros(4)})
    first = runner.run({"x": torch.zeros(2)})
    runner.run({"x": torch.full((2,), 5.0)})
    assert torch.equal(first, torch.full((2,), 6.0))  # a view of the static output, overwritten


def test_progress_bar_capture_runs() -> None:
    driver = SimulatedGraphDriver()
    runner = PaddedGraphRunner(lambda x: x * 3, [2, 4, 6], driver, progress=True)
    runner.capture({"x": torch.ones(6)})
    assert runner.captured_sizes == (2, 4, 6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_graph_capture_without_a_gpu_names_cuda() -> None:
    runner = CudaBackend().graph_runner(lambda x: x, [2])
    assert isinstance(runner, CudaGraphRunner)
    with pytest.raises(BackendError, match=r"needs an NVIDIA GPU with CUDA.*enforce_eager=True"):
        runner.capture({"x": torch.zeros(2)})


def test_enforce_eager_gives_the_eager_runner() -> None:
    eager = CudaBackend(enforce_eager=True).graph_runner(lambda x: x * 2, [2])
    assert isinstance(eager, EagerGraphRunner)
    eager.capture({"x": torch.zeros(2)})
    assert torch.equal(eager.run({"x": torch.ones(5)}), torch.full((5,), 2.0))
    runner = CudaBackend().graph_runner(lambda x: x, [2])
    assert isinstance(runner, CudaGraphRunner) and runner.warmup_iters == 2


def test_graph_options_are_backend_attributes() -> None:
    """The runner's options come from the backend instance: graph_runner takes only (fn, capture_sizes)."""
    backend = CudaBackend(graph_warmup_iters=5, graph_copy_output=False, graph_progress=False)
    runner = backend.graph_runner(lambda x: x, [2])
    assert isinstance(runner, CudaGraphRunner)
    assert (runner.warmup_iters, runner.copy_output, runner.progress) == (5, False, False)
    with pytest.raises(TypeError):
        backend.graph_runner(lambda x: x, [2], enforce_eager=True)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"graph_warmup_iters must be an integer >= 0, got -1"):
        CudaBackend(graph_warmup_iters=-1)
