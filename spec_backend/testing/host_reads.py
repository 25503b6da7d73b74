"""Counting what would synchronise with an accelerator: tensor-to-host conversions during a step.

On a CPU every tensor is a host tensor, so nothing synchronises; on a GPU each of these calls waits for
the device. ``HostReads`` counts the calls that turn a tensor into host values (``tolist``, ``item``,
``cpu``, ``numpy``, ``bool``, ``int``, ``float``, ``index``) while it is active; ``reads_per_decode_step``
applies it to every decode step of a ``generate`` call. Used by the step-sync tests and by
``benchmarks/bench_engine_gpu.py`` (syncs per step on the GPU).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

HOST_READS = {
    torch.Tensor.tolist,
    torch.Tensor.item,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
}


class HostReads(TorchFunctionMode):
    """Counts tensor-to-host conversions (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in HOST_READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def reads_per_decode_step(llm: Any, prompts: Any, params: Any) -> list[int]:
    """Run ``llm.generate(prompts, params)`` and return the host reads of each decode step."""
    stepper: Any = llm.engine.stepper
    decode, counts = stepper.decode, []

    def counted(requests: Any) -> None:
        with HostReads() as reads:
            decode(requests)
        counts.append(reads.count)

    stepper.decode = counted
    try:
        llm.generate(prompts, params)
    finally:
        del stepper.decode  # the class's method again
    return counts
