"""Markers and automatic skips for the hardware and optional tiers.

Tiers: ``statistical`` (Monte-Carlo, fixed seeds), ``e2e`` (the bundled SmolLM2 model), ``vllm``
(needs vLLM installed), ``cuda`` (needs an NVIDIA GPU), ``ascend`` (needs an Ascend NPU).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

MARKERS = {
    "statistical": "Monte-Carlo distribution tests with fixed seeds and a stated noise floor",
    "e2e": "end-to-end tests on the bundled SmolLM2-135M-Instruct model",
    "vllm": "needs vLLM installed (make test-vllm)",
    "cuda": "needs an NVIDIA GPU with CUDA",
    "ascend": "needs an Ascend NPU with CANN and torch_npu",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def _cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def _installed(module: str) -> bool:
    """A real installed module, not a same-named test folder (``tests/vllm`` is a namespace package)."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin is not None


def _skip_reasons() -> dict[str, str | None]:
    return {
        "vllm": None if _installed("vllm") else "vLLM is not installed (run make test-vllm)",
        "cuda": None if _cuda_available() else "no CUDA GPU on this machine",
        "ascend": None if _installed("torch_npu") else "no Ascend NPU software (torch_npu) on this machine",
    }


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons = _skip_reasons()
    for item in items:
        for marker, reason in reasons.items():
            if reason and item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
