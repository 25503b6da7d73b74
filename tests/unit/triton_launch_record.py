"""A pytest plugin (``-p triton_launch_record``) that writes one JSON line per distinct interpreted
triton launch to the file named by ``SPEC_BACKEND_TRITON_RECORD``: the kernel's module and name and
each argument's kind (a tensor's dtype, an int's or a float's value, a constexpr's value), which is
what ``triton_compile_recorded.py`` needs to compile the same specialisation for a GPU.

Only for the interpreter (``TRITON_INTERPRET=1``): it wraps ``InterpretedFunction.run``, the call every
interpreted ``kernel[grid](...)`` goes through, and passes the launch on unchanged.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import pytest
import torch


def argument_kind(value: Any) -> list[Any]:
    """``[kind, detail]`` of one launch argument (``detail``: a tensor's dtype, else the value)."""
    if isinstance(value, torch.Tensor):
        return ["ptr", str(value.dtype).removeprefix("torch.")]
    for kind, types in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(value, types):
            return [kind, value]
    if value is None:
        return ["none", None]
    return ["other", type(value).__name__]


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get("SPEC_BACKEND_TRITON_RECORD")
    if not path:
        return
    from triton.runtime import interpreter

    launch = interpreter.InterpretedFunction.run
    seen: set[str] = set()

    def recorded(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> Any:
        names = list(inspect.signature(self.fn).parameters)
        kinds = {name: argument_kind(value) for name, value in zip(names, args, strict=False)}
        kinds |= {name: argument_kind(value) for name, value in kwargs.items()}
        line = json.dumps(
            {"module": self.fn.__module__, "name": self.fn.__name__, "args": kinds}, sort_keys=True
        )
        if line not in seen:
            seen.add(line)
            with open(path, "a", encoding="utf-8") as out:
                out.write(line + "\n")
        return launch(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = recorded
