"""The fake NPU captures as the device does: ops issued inside ``torch.npu.graph`` are recorded, not
run, and run on replay. Before this, the fake ran them at capture, so a runner that returned a captured
output without replaying, or prepared a buffer after capture, passed here and failed on the device."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch


def test_captured_ops_do_not_run_until_replay(fake_npu: ModuleType) -> None:
    npu = torch.npu  # type: ignore[attr-defined]
    static = torch.arange(4.0)
    acc = torch.zeros(4)
    graph = npu.NPUGraph()
    with npu.graph(graph):
        out = static * 2 + 1  # fresh output: garbage until a replay
        acc.add_(static)  # in-place write: not applied at capture
    assert torch.isnan(out).all() and torch.equal(acc, torch.zeros(4))
    static.copy_(torch.tensor([10.0, 20.0, 30.0, 40.0]))  # a buffer prepared after capture
    graph.replay()
    assert torch.equal(out, torch.tensor([21.0, 41.0, 61.0, 81.0]))
    assert torch.equal(acc, torch.tensor([10.0, 20.0, 30.0, 40.0]))
    graph.replay()
    assert torch.equal(acc, torch.tensor([20.0, 40.0, 60.0, 80.0]))


def test_integer_outputs_and_fake_kernels_are_garbage_until_replay(fake_npu: ModuleType) -> None:
    npu = torch.npu  # type: ignore[attr-defined]
    lens = torch.tensor([3, 5])
    graph = npu.NPUGraph()
    with npu.graph(graph):
        shifted = lens + 7
        kernel_out = fake_npu._graph.kernel(lambda: lens.float() * 3)
    assert torch.equal(shifted, torch.zeros(2, dtype=torch.long)) and torch.isnan(kernel_out).all()
    graph.replay()
    assert torch.equal(shifted, torch.tensor([10, 12])) and torch.equal(kernel_out, torch.tensor([9.0, 15.0]))


def test_a_runner_that_skips_the_replay_is_caught(fake_npu: ModuleType) -> None:
    """Negative control: using the capture-time output as the first result (a runner bug) reads NaN."""
    npu = torch.npu  # type: ignore[attr-defined]
    x = torch.ones(3)
    graph = npu.NPUGraph()
    with npu.graph(graph):
        y = torch.softmax(x, dim=0)
    with pytest.raises(AssertionError):
        assert torch.allclose(y, torch.full((3,), 1 / 3))
    graph.replay()
    assert torch.allclose(y, torch.full((3,), 1 / 3))
