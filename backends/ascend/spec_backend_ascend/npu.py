"""Lazy access to ``torch_npu`` and the ``torch.npu`` namespace it installs.

``torch_npu`` cannot even be imported without Ascend CANN (``libhccl.so``), and importing it changes
``import torch`` behaviour process-wide, so nothing in this package imports it at module import time:
device code calls :func:`torch_npu_module` / :func:`npu_namespace` at the moment it needs the device.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

from spec_backend.backends.base import BackendError


def torch_npu_module() -> Any:
    """Import and return ``torch_npu``; raise ``BackendError`` with the cause when it cannot load."""
    try:
        module: ModuleType = importlib.import_module("torch_npu")
    except BaseException as exc:  # OSError without CANN, ImportError when absent
        raise BackendError(
            f"the ascend backend needs torch_npu on a machine with CANN: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def npu_namespace() -> Any:
    """``torch.npu`` (installed by importing ``torch_npu``): streams, graphs, events, devices."""
    torch_npu_module()
    npu = getattr(torch, "npu", None)
    if npu is None:
        raise BackendError("torch_npu imported but did not install the torch.npu namespace")
    return npu
