"""Markers for the CUDA backend tests: ``cuda`` tests need an NVIDIA GPU and are skipped without one.

tests/conftest.py does the same for the whole repository; this file makes ``pytest backends/cuda/tests``
work on its own (``--strict-markers`` needs the marker registered).
"""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU with CUDA")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
