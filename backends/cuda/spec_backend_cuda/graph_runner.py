"""CUDA-graph runner: capture ``fn(**inputs)`` per planned size with ``torch.cuda.CUDAGraph``, replay padded.

The bookkeeping (static buffers at the largest size, pad to the next captured size with a zeroed tail,
slice the output back, eager above the largest size, largest-first capture into one pool) is the
backend-neutral :class:`spec_backend.backends.graph_common.PaddedGraphRunner`; this module supplies
the CUDA primitives:

* **warm-up** — each size runs ``warmup_iters`` times eagerly on a side stream before capture, as
  PyTorch requires (lazy initialisation, cuBLAS workspaces, triton autotuning and allocator growth
  must not happen inside the graph);
* **capture** — ``torch.cuda.graph(graph, pool=pool)`` with one ``torch.cuda.graph_pool_handle()`` for
  every size of the runner, largest first, so the smaller graphs reuse the largest one's blocks;
* **replay** — ``graph.replay()`` on the current stream.

What a captured callable may do: only device work on tensors that are either static inputs, module
parameters/buffers, or tensors allocated inside the callable. Host synchronisation (``.item()``,
``.tolist()``, ``nonzero``, data-dependent shapes) fails at capture time; host values read while
capturing are frozen into the graph. A model-based drafter's K-step loop is captured as one graph by
capturing the Python loop itself (the loop unrolls into the graph).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from spec_backend.backends.base import BackendError, GraphFn, GraphOutput
from spec_backend.backends.graph_common import CapturedGraph, PaddedGraphRunner
from spec_backend_cuda.attention import begin_capture


def require_cuda(what: str) -> None:
    """Raise ``BackendError`` naming CUDA when no CUDA device is usable for ``what``."""
    if torch.cuda.is_available():
        return
    built = torch.version.cuda
    why = "torch was built without CUDA" if built is None else "no CUDA device is visible"
    raise BackendError(
        f"{what} needs an NVIDIA GPU with CUDA, but {why} (torch {torch.__version__}); "
        "use enforce_eager=True or the 'reference' backend on this machine"
    )


class CudaGraphDriver:
    """The CUDA primitives of :class:`PaddedGraphRunner`: pool, side-stream warm-up, capture, sync."""

    def __init__(self) -> None:
        self._stream: Any = None

    def check_device(self) -> None:
        require_cuda("CUDA graph capture")

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def warm_up(self, call: Callable[[], GraphOutput], iterations: int) -> None:
        """Run ``call`` eagerly on a side stream (PyTorch's documented pre-capture warm-up)."""
        if self._stream is None:
            self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        current = torch.cuda.current_stream()
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            for _ in range(iterations):
                call()
        current.wait_stream(self._stream)

    def capture(self, call: Callable[[], GraphOutput], pool: Any) -> tuple[CapturedGraph, GraphOutput]:
        """Capture ``call()``; its output (one tensor or a tuple) is the graph's static output."""
        graph = torch.cuda.CUDAGraph()
        begin_capture()
        with torch.cuda.graph(graph, pool=pool):
            output = call()
        return graph, output

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def capture_once(
        self, call: Callable[[], Any], warmup_iters: int = 2, pool: Any = None
    ) -> tuple[torch.cuda.CUDAGraph, Any]:
        """Warm up and capture ``call()`` (any return value) into a new graph; return graph and outputs.

        For callables whose inputs live in caller-owned static tensors (e.g. a sampler call over a
        static logits buffer): write new inputs into those tensors, then ``graph.replay()``.
        """
        self.check_device()
        with torch.no_grad():
            self.warm_up(call, warmup_iters)
            graph = torch.cuda.CUDAGraph()
            begin_capture()
            with torch.cuda.graph(graph, pool=pool):
                output = call()
        torch.cuda.synchronize()
        return graph, output


class CudaGraphRunner(PaddedGraphRunner):
    """``GraphRunner`` on ``torch.cuda.CUDAGraph`` (see the module docstring).

    ``capture(example_inputs)`` takes inputs sized at (at least) the largest capture size, on the GPU;
    ``run(inputs)`` replays the smallest captured size that holds ``inputs``' token count.
    """

    def __init__(
        self,
        fn: GraphFn,
        capture_sizes: Sequence[int],
        warmup_iters: int = 2,
        copy_output: bool = True,
        progress: bool = True,
    ) -> None:
        super().__init__(
            fn,
            capture_sizes,
            CudaGraphDriver(),
            warmup_iters=warmup_iters,
            copy_output=copy_output,
            progress=progress,
            desc="Capturing CUDA graphs",
        )


__all__ = ["CudaGraphDriver", "CudaGraphRunner", "require_cuda"]
