"""vLLM tier set-up: runs vLLM's V1 rejection sampler on CPU tensors.

vLLM disables triton when no GPU driver is active (``vllm.triton_utils.HAS_TRITON``), which would
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


def _vllm_installed() -> bool:
    """The real vLLM, not this directory: with ``tests/`` on ``sys.path`` (rootdir conftest, no
    ``__init__.py``), ``find_spec("vllm")`` also finds ``tests/vllm`` as a namespace package, whose
    spec has no origin."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


VLLM_INSTALLED = _vllm_installed()

if VLLM_INSTALLED and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


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
