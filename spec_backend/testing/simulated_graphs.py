"""A backend that stands in for a GPU's on a CPU: the reference backend's ops with its decode steps
"captured" over ``SimulatedGraphDriver(strict=True)`` (a host read or a tensor made from host data inside
a captured callable raises, as a device graph refuses or freezes it), captured attention reading lengths
from the device, and async scheduling on by default, as CUDA's. For dry runs of the GPU benchmarks
(``benchmarks/bench_engine_gpu.py --dry-run``), which then take the paths a GPU takes; nothing is faster
for it (replays re-run their callables)."""

from __future__ import annotations

from collections.abc import Sequence

from spec_backend.backends.base import CapturePolicy, GraphFn, GraphRunner
from spec_backend.backends.graph_common import PaddedGraphRunner, SimulatedGraphDriver
from spec_backend.backends.reference import ReferenceBackend


class SimulatedGraphsBackend(ReferenceBackend):
    """See the module docstring. ``max_capture_size``: the largest captured token count."""

    name = "simulated-graphs"
    captures_draft_chains = True
    launches_async = True

    def __init__(self, max_capture_size: int = 64) -> None:
        self.max_capture_size = max_capture_size

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        return CapturePolicy(max_capture_size=self.max_capture_size, graph_budget=None, enabled=True)

    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        return PaddedGraphRunner(fn, capture_sizes, SimulatedGraphDriver(strict=True), progress=False)


__all__ = ["SimulatedGraphsBackend"]
