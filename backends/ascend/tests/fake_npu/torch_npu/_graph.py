"""Fake ``torch.npu`` graph machinery with real capture/replay semantics on CPU.

Capture records every aten op issued inside ``torch.npu.graph(g)`` (a ``TorchDispatchMode``), with
the very tensors it reads and writes, and, like the device, does not run it: tensors an op would write
in place keep their contents, and the outputs it allocates hold garbage (NaN, or 0 for integers) until
a replay (``record_without_running``). Replay re-executes the recorded ops and copies each result into
the tensor the op produced at capture time, so later ops (and the caller holding the captured output)
see fresh values — exactly like a device graph, Python control flow and host values (e.g. FIA's
sequence-length lists) are frozen at capture. Host syncs (``.item()``, ``.tolist()``) inside a capture
raise, as they do on the device. A fake device kernel (``kernel``) issued while capturing or updating a
task is recorded the same way.

``graph_task_group_begin/end`` name a range of recorded ops (a kernel task); between
``graph_task_update_begin(stream, handle)`` and ``graph_task_update_end(stream)`` the ops issued are
recorded and replace that range. ``ExternalEvent.wait`` captured into a graph makes replay fail
unless the event was recorded since (on the device replay would block forever); ``reset`` re-arms it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

#: (event, detail) tuples in call order; tests assert on it (e.g. update before replay).
CALLS: list[tuple[str, Any]] = []
_SYNC_OPS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}
_pool_ids = itertools.count(1)


@dataclass
class _Op:
    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any

    def run(self) -> None:
        _copy_into(self.out, self.func(*self.args, **self.kwargs))


@dataclass
class _Kernel:
    """A fake device kernel (e.g. FIA): one task that re-reads its input tensors at replay."""

    fn: Any
    out: Any

    def run(self) -> None:
        _copy_into(self.out, self.fn())


@dataclass
class TaskGroup:
    """A named kernel task inside a graph (the handle ``graph_task_group_end`` returns)."""

    graph: NPUGraph
    ops: list[Any] = field(default_factory=list)
    updates: int = 0


@dataclass
class _EventWait:
    event: ExternalEvent


@dataclass
class _EventReset:
    event: ExternalEvent


def _copy_into(dst: Any, src: Any) -> None:
    if isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor):
        same = dst.data_ptr() == src.data_ptr() and dst.stride() == src.stride()
        if not same and dst.shape == src.shape:
            dst.copy_(src)
    elif isinstance(dst, (tuple, list)) and isinstance(src, (tuple, list)):
        for d, s in zip(dst, src, strict=False):
            _copy_into(d, s)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _written_args(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """Tensors an aten op writes in place (``alias_info.is_write`` in its schema: ``x.add_``, ``out=``)."""
    written: list[torch.Tensor] = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        written.extend(_tensors(value))
    return written


def poison(tensors: list[torch.Tensor]) -> None:
    """Fill what a kernel that has not run yet would leave: NaN for floats, 0 for integers and bools."""
    for t in tensors:
        with _disable_current_modes():
            t.fill_(float("nan") if t.is_floating_point() else 0)


def record_without_running(fn: Any, inputs: list[torch.Tensor], written: list[torch.Tensor]) -> Any:
    """Issue an op during capture as the device does: recorded, not run.

    The op runs once to build its outputs (shapes, dtypes, aliasing), then every tensor it wrote in place
    gets its previous contents back and every fresh output is poisoned, so code that reads a captured
    result before a replay (or prepares a buffer after capture and never replays) sees garbage.
    """
    with _disable_current_modes():
        saved = [t.clone() for t in written]
        out = fn()
        for t, old in zip(written, saved, strict=True):
            t.copy_(old)
    storages = {t.untyped_storage().data_ptr() for t in inputs + written}
    poison([t for t in _tensors(out) if t.untyped_storage().data_ptr() not in storages])
    return out


class _Recorder(TorchDispatchMode):
    def __init__(self, sink: list[Any]) -> None:
        super().__init__()
        self.sink = sink

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _SYNC_OPS:
            raise RuntimeError(f"{func} synchronises with the host and cannot be captured into an NPUGraph")
        inputs = _tensors(list(args)) + _tensors(list(kwargs.values()))
        out = record_without_running(
            lambda: func(*args, **kwargs), inputs, _written_args(func, tuple(args), kwargs)
        )
        self.sink.append(_Op(func, args, kwargs, out))
        return out


class _State:
    capturing: NPUGraph | None = None
    recorder: _Recorder | None = None
    group: TaskGroup | None = None
    updating: TaskGroup | None = None


STATE = _State()


def _active_sink() -> list[Any] | None:
    if _update_recorder:
        return _update_recorder[-1].sink
    return STATE.recorder.sink if STATE.recorder is not None else None


def kernel(fn: Any) -> Any:
    """Run a fake device op; while capturing (or updating a task) record it as one kernel task.

    The op's own host-side validation runs outside the recorder, like the real op's host checks.
    """
    sink = _active_sink()
    if sink is None:
        return fn()
    with _disable_current_modes():
        out = fn()
    poison(_tensors(out))  # recorded, not run: its output holds nothing until a replay
    sink.append(_Kernel(fn, out))
    return out


def host_call(fn: Any) -> Any:
    """Run host-side work (e.g. a workspace-size query) without recording it."""
    with _disable_current_modes():
        return fn()


class NPUGraph:
    """Records ops during ``torch.npu.graph(self)`` and re-executes them on ``replay()``."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.pool_id: int | None = None
        self.replays = 0

    def pool(self) -> int:
        if self.pool_id is None:
            raise RuntimeError("pool() is only valid after capture")
        return self.pool_id

    def replay(self) -> None:
        if STATE.capturing is not None:
            raise RuntimeError("cannot replay while capturing")
        CALLS.append(("replay", self))
        self.replays += 1
        for item in self.items:
            if isinstance(item, _EventWait):
                if not item.event.recorded:
                    raise RuntimeError(
                        "NPUGraph replay waits on an ExternalEvent that was never recorded: the captured "
                        "task was not updated before this replay (the device would block forever)"
                    )
            elif isinstance(item, _EventReset):
                item.event.recorded = False
            elif isinstance(item, TaskGroup):
                for op in item.ops:
                    op.run()
            else:
                item.run()


#: Streams the fake device has for captured graphs (the real one has 2048 in all); each capture takes one.
STREAMS = {"limit": 2048, "used": 0}


def _take_capture_stream() -> None:
    """Fail as CANN does (runtime error 207008, text as in vllm-ascend RFC #9691) when streams run out."""
    if STREAMS["used"] >= STREAMS["limit"]:
        raise RuntimeError(
            "capture_begin:../torch_npu/csrc/core/npu/NPUGraph.cpp:230 NPU function error: "
            "c10_npu::acl::AclmdlRICaptureBegin(capture_stream_, capture_mode), error code is 207008\n"
            "[Error]: Stream resources are insufficient."
        )
    STREAMS["used"] += 1


@contextmanager
def graph(npu_graph: NPUGraph, pool: int | None = None, stream: Any = None, **_: Any) -> Iterator[None]:
    """Capture context: every aten op inside is recorded into ``npu_graph``."""
    if STATE.capturing is not None:
        raise RuntimeError("nested NPUGraph capture")
    _take_capture_stream()
    npu_graph.pool_id = pool if pool is not None else next(_pool_ids)
    CALLS.append(("capture_begin", npu_graph))
    STATE.capturing, STATE.recorder = npu_graph, _Recorder(npu_graph.items)
    try:
        with STATE.recorder:
            yield
    finally:
        STATE.capturing, STATE.recorder = None, None
        CALLS.append(("capture_end", npu_graph))
    if STATE.group is not None:
        STATE.group = None
        raise RuntimeError("graph_task_group_begin without graph_task_group_end")


def graph_pool_handle() -> int:
    return next(_pool_ids)


def is_current_stream_capturing() -> bool:
    return STATE.capturing is not None


def graph_task_group_begin(stream: Any) -> None:
    if STATE.capturing is None or STATE.recorder is None:
        raise RuntimeError("graph_task_group_begin outside of an NPUGraph capture")
    if STATE.group is not None:
        raise RuntimeError("graph_task_group_begin: a task group is already open")
    STATE.group = TaskGroup(STATE.capturing)
    STATE.recorder.sink = STATE.group.ops


def graph_task_group_end(stream: Any) -> TaskGroup:
    if STATE.capturing is None or STATE.recorder is None or STATE.group is None:
        raise RuntimeError("graph_task_group_end without graph_task_group_begin")
    group, STATE.group = STATE.group, None
    if not group.ops:
        raise RuntimeError("graph_task_group_end: the task group captured no kernel")
    STATE.capturing.items.append(group)
    STATE.recorder.sink = STATE.capturing.items
    return group


_update_recorder: list[_Recorder] = []


def graph_task_update_begin(stream: Any, handle: TaskGroup) -> None:
    if STATE.capturing is not None or STATE.updating is not None:
        raise RuntimeError("graph_task_update_begin while capturing or inside another update")
    if not isinstance(handle, TaskGroup):
        raise TypeError("graph_task_update_begin needs a handle from graph_task_group_end")
    CALLS.append(("task_update", handle))
    STATE.updating = handle
    recorder = _Recorder([])
    recorder.__enter__()
    _update_recorder.append(recorder)


def graph_task_update_end(stream: Any) -> None:
    if STATE.updating is None:
        raise RuntimeError("graph_task_update_end without graph_task_update_begin")
    recorder = _update_recorder.pop()
    recorder.__exit__(None, None, None)
    if not recorder.sink:
        raise RuntimeError("graph_task_update_end: no kernel was re-issued for the task")
    STATE.updating.ops, STATE.updating.updates = recorder.sink, STATE.updating.updates + 1
    STATE.updating = None


class Stream:
    """No-op stream; the fake executes synchronously on the CPU."""

    def synchronize(self) -> None:
        CALLS.append(("synchronize", self))

    def wait_stream(self, other: Stream) -> None:
        del other


_DEFAULT_STREAM = Stream()


def current_stream(device: Any = None) -> Stream:
    return _DEFAULT_STREAM


@contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    yield


def synchronize(device: Any = None) -> None:
    CALLS.append(("synchronize", None))


class ExternalEvent:
    """Event whose captured ``wait`` gates replay until ``record`` is called from the host."""

    def __init__(self) -> None:
        self.recorded = False

    def wait(self, s: Stream) -> None:
        if STATE.capturing is None:
            raise RuntimeError("ExternalEvent.wait is only emulated inside an NPUGraph capture")
        STATE.capturing.items.append(_EventWait(self))

    def reset(self, s: Stream) -> None:
        if STATE.capturing is None:
            raise RuntimeError("ExternalEvent.reset is only emulated inside an NPUGraph capture")
        STATE.capturing.items.append(_EventReset(self))

    def record(self, s: Stream) -> None:
        CALLS.append(("event_record", self))
        self.recorded = True
