"""A backend that stands in for a GPU's on a CPU: the reference backend's ops with its decode steps
"captured" over ``SimulatedGraphDriver(strict=True)`` (a host read or a tensor made from host data inside
a captured callable raises, as a device graph refuses or freezes it), captured attention reading lengths
from the device, and async scheduling on by default, as CUDA's. For dry runs of the GPU benchmarks
(``benchmarks/bench_engine_gpu.py --dry-run``), which then take the paths a GPU takes; nothing is faster
for it (replays re-run their callables)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from spec_backend.backends.base import CapturePolicy, GraphFn, GraphOutput, GraphRunner
from spec_backend.backends.graph_common import CapturedGraph, PaddedGraphRunner, SimulatedGraphDriver
from spec_backend.backends.reference import ReferenceBackend


class _MarkedGraph:
    """A simulated graph whose replays (the callable's re-run and the copy into its outputs, which a
    device graph writes in place) count in ``owner.in_graph``."""

    def __init__(self, graph: CapturedGraph, owner: SimulatedGraphsBackend) -> None:
        self.graph, self.owner = graph, owner

    def replay(self) -> None:
        self.owner.in_graph += 1
        try:
            self.graph.replay()
        finally:
            self.owner.in_graph -= 1


class _MarkedDriver(SimulatedGraphDriver):
    """The strict simulated driver, counting in ``owner.in_graph`` while a captured callable runs."""

    def __init__(self, owner: SimulatedGraphsBackend) -> None:
        super().__init__(strict=True)
        self.owner = owner

    def capture(self, call: Callable[[], GraphOutput], pool: Any) -> tuple[CapturedGraph, GraphOutput]:
        owner = self.owner

        def marked() -> GraphOutput:
            owner.in_graph += 1
            try:
                return call()
            finally:
                owner.in_graph -= 1

        graph, output = super().capture(marked, pool)
        return _MarkedGraph(graph, owner), output


class SimulatedGraphsBackend(ReferenceBackend):
    """See the module docstring. ``max_capture_size``: the largest captured token count."""

    name = "simulated-graphs"
    captures_draft_chains = True
    launches_async = True
    reads_early = True  # as CUDA's (a CPU tensor's copy to the host is made at once either way)

    def __init__(self, max_capture_size: int = 64) -> None:
        self.max_capture_size = max_capture_size
        #: > 0 while a captured callable runs (a capture or a replay): what a device would run as one
        #: graph, not op by op from the host (``benchmarks/count_step_ops.py --graphs`` leaves it out)
        self.in_graph = 0

    def start_host_copy(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        """The tensor itself: on a CPU it is on the host already (its read is the one ``tolist``)."""
        return lambda: tensor

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        return CapturePolicy(max_capture_size=self.max_capture_size, graph_budget=None, enabled=True)

    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        return PaddedGraphRunner(fn, capture_sizes, _MarkedDriver(self), progress=False)


__all__ = ["SimulatedGraphsBackend"]
