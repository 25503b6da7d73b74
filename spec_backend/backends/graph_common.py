"""Backend-neutral graph-runner machinery: static buffers, padding, slicing, capture order.

Every graph backend does the same bookkeeping around its device's graph object:

* **static inputs** — one buffer per input, allocated once at the largest capture size; the graph of
  size ``s`` reads the views ``buffer[:s]`` (:class:`StaticInputs`);
* **padding** — a call with ``n`` tokens replays the smallest captured size ``s >= n``: the inputs are
  copied into ``buffer[:n]`` and ``buffer[n:s]`` is zeroed; the output — one tensor or a tuple of
  tensors, each with the token count as its leading dimension — is sliced back to ``n`` rows;
* **eager fallback** — above the largest captured size (or before ``capture``) the callable runs
  eagerly on the caller's tensors;
* **capture order** — largest size first, every size in one memory pool, so the smaller graphs reuse
  the blocks the largest one allocated.

:class:`PaddedGraphRunner` implements all of that over a :class:`GraphDriver`, the few device
primitives (make a pool, warm up, capture one graph, synchronise). The CUDA and Ascend backends
plug in ``torch.cuda.CUDAGraph`` and ``torch.npu.NPUGraph``; :class:`SimulatedGraphDriver` "replays"
by re-running the callable on the static buffers, which lets the padding and slicing logic be tested
on CPU.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch.overrides import TorchFunctionMode

from spec_backend.backends.base import GraphFn, GraphOutput, GraphRunner
from spec_backend.graphs import padded_size

logger = logging.getLogger(__name__)


class CapturedGraph(Protocol):
    """A captured graph: ``replay()`` re-issues the recorded work on the same buffers."""

    def replay(self) -> None: ...


class GraphDriver(Protocol):
    """Device primitives behind :class:`PaddedGraphRunner`."""

    def check_device(self) -> None:
        """Raise a clear error when the device that captures graphs is missing."""
        ...

    def new_pool(self) -> Any:
        """A memory-pool handle shared by every graph of one runner."""
        ...

    def warm_up(self, call: Callable[[], GraphOutput], iterations: int) -> None:
        """Run ``call`` eagerly ``iterations`` times as the device requires before capture."""
        ...

    def capture(self, call: Callable[[], GraphOutput], pool: Any) -> tuple[CapturedGraph, GraphOutput]:
        """Capture ``call()`` into a graph that allocates from ``pool``; return it and its output(s)."""
        ...

    def synchronize(self) -> None:
        """Wait for the device."""
        ...


class StaticInputs:
    """Static input buffers sized at the largest capture size; views, padded copies, validation."""

    def __init__(
        self, example_inputs: Mapping[str, torch.Tensor], largest: int, shared: Collection[str] = ()
    ) -> None:
        unknown = sorted(set(shared) - set(example_inputs))
        if unknown:
            raise ValueError(
                f"shared inputs {unknown} are not among the example inputs {sorted(example_inputs)}"
            )
        self.buffers: dict[str, torch.Tensor] = {}
        for name, tensor in example_inputs.items():
            if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
                raise ValueError(f"example input {name!r} must be a tensor with a leading token dimension")
            if tensor.shape[0] < largest:
                raise ValueError(
                    f"example input {name!r} has {tensor.shape[0]} rows, "
                    f"the largest capture size needs {largest}"
                )
            # [largest, ...]: a shared input is the caller's tensor (``GraphRunner.capture``)
            self.buffers[name] = tensor[:largest] if name in shared else tensor[:largest].clone()
        if not self.buffers:
            raise ValueError("capture needs at least one example input tensor")
        self._views: dict[int, dict[str, torch.Tensor]] = {}

    def views(self, size: int) -> dict[str, torch.Tensor]:
        """The inputs of the graph of ``size``: ``buffer[:size]`` for every input (made once per size: a
        replay's host work is what a captured step is there to cut)."""
        views = self._views.get(size)
        if views is None:
            views = self._views[size] = {name: buffer[:size] for name, buffer in self.buffers.items()}
        return views

    def check(self, inputs: Mapping[str, torch.Tensor]) -> int:
        """Validate ``inputs`` against the buffers and return their common leading dimension."""
        if set(inputs) != set(self.buffers):
            raise ValueError(
                f"inputs {sorted(inputs)} differ from the captured inputs {sorted(self.buffers)}"
            )
        for name, tensor in inputs.items():
            buffer = self.buffers[name]
            if tensor.dtype != buffer.dtype or tensor.shape[1:] != buffer.shape[1:]:
                raise ValueError(
                    f"input {name!r} is {tensor.dtype} {list(tensor.shape)}, the graphs were captured for "
                    f"{buffer.dtype} [N, {', '.join(str(d) for d in buffer.shape[1:])}]"
                )
        return num_tokens(inputs)

    def fill(self, inputs: Mapping[str, torch.Tensor], size: int) -> dict[str, torch.Tensor]:
        """Copy ``n`` rows of ``inputs`` into the buffers, zero rows ``n..size-1``; return the views."""
        views = self.views(size)
        for name, view in views.items():
            src = inputs[name]
            n = src.shape[0]
            if src.data_ptr() != view.data_ptr():  # the caller may already write into the buffer
                (view if n == size else view[:n]).copy_(src)
            if n < size:
                view[n:].zero_()
        return views


def output_tensors(output: object) -> tuple[torch.Tensor, ...]:
    """The tensors of a captured callable's output: ``(output,)`` for one tensor, the tuple itself for a
    non-empty tuple of tensors; ``TypeError`` naming what was returned otherwise."""
    if isinstance(output, torch.Tensor):
        return (output,)
    if isinstance(output, tuple) and output and all(isinstance(t, torch.Tensor) for t in output):
        return output
    got = type(output).__name__
    if isinstance(output, tuple):
        got = f"tuple({', '.join(type(t).__name__ for t in output)})"
    raise TypeError(f"captured callables must return one tensor or a non-empty tuple of tensors, got {got}")


def check_outputs(output: GraphOutput, size: int) -> None:
    """Every output tensor must have the token count ``size`` as its leading dimension."""
    for i, tensor in enumerate(output_tensors(output)):
        if tensor.dim() == 0 or tensor.shape[0] != size:
            where = "the output's" if isinstance(output, torch.Tensor) else f"output {i}'s"
            raise ValueError(
                f"{where} leading dimension must be the token count {size}, got shape {list(tensor.shape)}"
            )


def slice_outputs(output: GraphOutput, n: int, copy: bool) -> GraphOutput:
    """``output`` (one tensor [S, ...] or a tuple of them) cut to its first ``n`` rows, copied if ``copy``."""
    if isinstance(output, torch.Tensor):
        return output[:n].clone() if copy else output[:n]
    return tuple(t[:n].clone() if copy else t[:n] for t in output)


def num_tokens(inputs: Mapping[str, torch.Tensor]) -> int:
    """The common leading (token) dimension of ``inputs``; ``ValueError`` when they disagree."""
    counts = {t.shape[0] for t in inputs.values()}
    if len(counts) != 1:
        raise ValueError(f"all inputs must share their leading (token) dimension, got {sorted(counts)}")
    return counts.pop()


def _progress(sizes: Sequence[int], desc: str, enabled: bool) -> Iterable[int]:
    """``sizes`` wrapped in a tqdm bar when tqdm is installed and ``enabled``."""
    if not enabled:
        return sizes
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with transformers
        return sizes
    bar: Iterable[int] = tqdm(sizes, desc=desc, unit="graph", leave=False)
    return bar


class PaddedGraphRunner(GraphRunner):
    """``GraphRunner`` over a :class:`GraphDriver` (see the module docstring for the behaviour).

    ``fn`` returns one tensor or a tuple of tensors, each [size, ...]; ``run`` returns the same
    structure cut to the real token count. ``warmup_iters``: eager runs per size before it is captured
    (lazy initialisation, autotuning and allocator growth must happen outside the graph).
    ``copy_output``: return copies of the sliced outputs (default) — the static outputs are overwritten
    by the next replay of that graph; pass ``False`` when the caller consumes the result before the next
    ``run``. ``progress``: a tqdm bar while capturing.
    """

    def __init__(
        self,
        fn: GraphFn,
        capture_sizes: Sequence[int],
        driver: GraphDriver,
        warmup_iters: int = 2,
        copy_output: bool = True,
        progress: bool = True,
        desc: str = "Capturing graphs",
    ) -> None:
        super().__init__(fn, capture_sizes)
        if not self.capture_sizes:
            raise ValueError("a graph runner needs at least one capture size")
        if any(s < 1 for s in self.capture_sizes):
            raise ValueError(f"capture sizes must be positive, got {list(self.capture_sizes)}")
        self.driver = driver
        self.warmup_iters = warmup_iters
        self.copy_output = copy_output
        self.progress = progress
        self.desc = desc
        self.pool: Any = None
        self._graphs: dict[int, CapturedGraph] = {}
        self._outputs: dict[int, GraphOutput] = {}
        self._static: StaticInputs | None = None
        self.replays = 0  # replays served (for tests and metrics)
        self.eager_calls = 0  # calls that ran eagerly (above the largest size or before capture)

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        """Sizes that have a captured graph (ascending)."""
        return tuple(sorted(self._graphs))

    @property
    def static_inputs(self) -> dict[str, torch.Tensor]:
        """The static buffers at the largest size (callers may write inputs into them directly)."""
        if self._static is None:
            raise RuntimeError("capture() has not run yet: there are no static buffers")
        return self._static.buffers

    def capture(self, example_inputs: Mapping[str, torch.Tensor], shared: Collection[str] = ()) -> None:
        """Capture one graph per size, largest first, in one pool, over buffers cloned from the example
        (those named in ``shared`` are the example's tensors: ``GraphRunner.capture``)."""
        self.driver.check_device()
        if self._graphs:
            raise RuntimeError("this runner has already captured its graphs; make a new runner to re-capture")
        static = StaticInputs(example_inputs, self.capture_sizes[-1], shared)
        self.pool = self.driver.new_pool()
        with torch.no_grad():
            for size in _progress(list(reversed(self.capture_sizes)), self.desc, self.progress):
                views = static.views(size)

                def call(views: dict[str, torch.Tensor] = views) -> GraphOutput:
                    return self.fn(**views)

                self.driver.warm_up(call, self.warmup_iters)
                graph, output = self.driver.capture(call, self.pool)
                check_outputs(output, size)
                self._graphs[size], self._outputs[size] = graph, output
        self.driver.synchronize()
        self._static = static
        logger.info("captured %d graphs for sizes %s", len(self._graphs), list(self.captured_sizes))

    def run(self, inputs: Mapping[str, torch.Tensor]) -> GraphOutput:
        """Replay the smallest captured graph that holds the inputs; eager above the largest. Returns the
        callable's structure (one tensor or a tuple), every tensor [n, ...]."""
        n = num_tokens(inputs) if self._static is None else self._static.check(inputs)
        size = padded_size(n, self._graphs)
        if size is None or self._static is None:
            self.eager_calls += 1
            with torch.no_grad():
                return self.fn(**inputs)
        views = self._static.fill(inputs, size)
        self.before_replay(size, views)
        self._graphs[size].replay()
        self.replays += 1
        return slice_outputs(self._outputs[size], n, self.copy_output)

    def before_replay(self, size: int, views: Mapping[str, torch.Tensor]) -> None:
        """Extension point: runs after the inputs are in the static buffers, before each replay
        (Ascend re-writes captured attention parameters here). Default: nothing."""
        del size, views


#: the calls that turn a tensor's values into host values: each waits for the device, which a graph being
#: captured cannot (``spec_backend.testing.host_reads`` counts them)
HOST_READ_FUNCS = frozenset(
    {
        torch.Tensor.tolist,
        torch.Tensor.item,
        torch.Tensor.cpu,
        torch.Tensor.numpy,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__index__,
    }
)


class GraphUnsafeCall(RuntimeError):
    """A captured callable read a tensor back to the host, or made one from host data: a device graph
    would freeze that value at capture (or refuse the copy), so replays with new inputs would be wrong."""


class _CaptureGuard(TorchFunctionMode):
    """Raises ``GraphUnsafeCall`` at a host read or a tensor made from Python data (``torch.tensor``,
    ``torch.as_tensor`` of a list: a host-to-device copy on a device) while active."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from_host = func in (torch.tensor, torch.as_tensor) and not isinstance(args[0], torch.Tensor)
        if func in HOST_READ_FUNCS or from_host:
            name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
            raise GraphUnsafeCall(f"{name} inside a captured graph (a host read or a copy from the host)")
        return func(*args, **(kwargs or {}))


class _SimulatedGraph:
    """Records the callable; ``replay`` re-runs it and copies every output into the captured outputs
    (the same buffers, as a device graph writes them). ``strict``: the re-runs refuse what a device graph
    cannot hold (``GraphUnsafeCall``)."""

    def __init__(self, call: Callable[[], GraphOutput], output: GraphOutput, strict: bool = False) -> None:
        self.call, self.output, self.replays, self.strict = call, output, 0, strict

    def replay(self) -> None:
        with _CaptureGuard() if self.strict else contextlib.nullcontext():
            fresh = output_tensors(self.call())
        for static, new in zip(output_tensors(self.output), fresh, strict=True):
            static.copy_(new)
        self.replays += 1


class SimulatedGraphDriver:
    """A :class:`GraphDriver` without a device: 'capture' runs the callable once and keeps it.

    Replays re-run the callable on the static buffers and copy into the captured output tensor, so
    everything around the graph (padding, zeroed tails, slicing, eager fallback, capture order, pool
    sharing) behaves as on a device. Host values read by the callable are *not* frozen as they would
    be in a real graph: ``strict=True`` refuses them instead, at capture and at every replay
    (``GraphUnsafeCall``), as a device refuses or silently freezes them. For tests on CPU.
    """

    def __init__(self, strict: bool = False) -> None:
        self.events: list[tuple[str, Any]] = []
        self._pools = 0
        self.strict = strict

    def check_device(self) -> None:
        return None

    def new_pool(self) -> Any:
        self._pools += 1
        self.events.append(("pool", self._pools))
        return self._pools

    def warm_up(self, call: Callable[[], GraphOutput], iterations: int) -> None:
        for _ in range(iterations):
            call()
        self.events.append(("warm_up", iterations))

    def capture(self, call: Callable[[], GraphOutput], pool: Any) -> tuple[CapturedGraph, GraphOutput]:
        with _CaptureGuard() if self.strict else contextlib.nullcontext():
            output = call()
        first = output_tensors(output)[0]
        self.events.append(("capture", (first.shape[0] if first.dim() else None, pool)))
        return _SimulatedGraph(call, output, self.strict), output

    def synchronize(self) -> None:
        self.events.append(("synchronize", None))


__all__ = [
    "HOST_READ_FUNCS",
    "CapturedGraph",
    "GraphDriver",
    "GraphUnsafeCall",
    "PaddedGraphRunner",
    "SimulatedGraphDriver",
    "StaticInputs",
    "check_outputs",
    "num_tokens",
    "output_tensors",
    "slice_outputs",
]
