"""Counting what would synchronise with an accelerator: tensor-to-host conversions during a step.

On a CPU every tensor is a host tensor, so nothing synchronises; on a GPU each of these calls waits for
the device. ``HostReads`` counts the calls that turn a tensor into host values (``tolist``, ``item``,
``cpu``, ``numpy``, ``bool``, ``int``, ``float``, ``index``) while it is active (``CallCounter`` counts
any other set of torch functions the same way); ``reads_per_decode_step`` applies it to every decode step
of a ``generate`` call, through ``wrapped_decode``, which runs a callback around each decode step (the
benchmarks time steps with it, ``decode_step_seconds``). Used by the step-sync and plugin tests and by
``benchmarks/`` (syncs and time per step on the GPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

from torch.overrides import TorchFunctionMode

from spec_backend.backends.graph_common import HOST_READ_FUNCS

HOST_READS = HOST_READ_FUNCS


class CallCounter(TorchFunctionMode):
    """Counts the calls of ``funcs`` while active."""

    def __init__(self, funcs: Collection[Any]) -> None:
        super().__init__()
        self.funcs = funcs
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in self.funcs:
            self.count += 1
        return func(*args, **(kwargs or {}))


class HostReads(CallCounter):
    """Counts tensor-to-host conversions (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(HOST_READS)


@contextmanager
def wrapped_decode(llm: Any, around: Callable[[Callable[[], None]], None]) -> Iterator[None]:
    """While active, each decode step of ``llm`` runs as ``around(step)``; ``around`` must call ``step``."""
    stepper: Any = llm.engine.stepper
    lookahead: Any = llm.engine.lookahead  # async scheduling's steps (``engine/lookahead.py``)
    decode = stepper.decode
    ahead = lookahead.step if lookahead is not None else None

    def step(requests: Any) -> None:
        around(lambda: decode(requests))

    def step_ahead(requests: Any) -> None:
        assert ahead is not None
        around(lambda: ahead(requests))

    stepper.decode = step
    if lookahead is not None:
        lookahead.step = step_ahead
    try:
        yield
    finally:
        del stepper.decode  # the class's methods again
        if lookahead is not None:
            del lookahead.step


@contextmanager
def decode_step_seconds(llm: Any) -> Iterator[list[float]]:
    """While active, the wall time of each decode step of ``llm`` is appended to the list it yields."""
    seconds: list[float] = []

    def timed(step: Callable[[], None]) -> None:
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)

    with wrapped_decode(llm, timed):
        yield seconds


def reads_per_decode_step(llm: Any, prompts: Any, params: Any) -> list[int]:
    """Run ``llm.generate(prompts, params)`` and return the host reads of each decode step."""
    counts: list[int] = []

    def counted(step: Callable[[], None]) -> None:
        with HostReads() as reads:
            step()
        counts.append(reads.count)

    with wrapped_decode(llm, counted):
        llm.generate(prompts, params)
    return counts
