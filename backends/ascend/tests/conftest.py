"""Fixtures for the Ascend backend tests.

``fake_npu`` puts the fake ``torch_npu`` (tests/fake_npu) on ``sys.path`` for one test only and
removes every trace afterwards (``sys.modules`` entries and the ``torch.npu`` attribute), so no
other test ever sees an "available" NPU. Tests marked ``ascend`` need the real stack and are skipped
where ``torch_npu`` is not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

FAKE_DIR = Path(__file__).parent / "fake_npu"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ascend: needs an Ascend NPU with CANN and torch_npu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("torch_npu") is not None:
        return
    skip = pytest.mark.skip(reason="no Ascend NPU software (torch_npu) on this machine")
    for item in items:
        if item.get_closest_marker("ascend") is not None:  # not item.keywords: it holds dir names
            item.add_marker(skip)


def _forget_torch_npu() -> None:
    """Drop the fake and what was decided from its presence (transformers caches its NPU probe)."""
    for name in [n for n in sys.modules if n == "torch_npu" or n.startswith("torch_npu.")]:
        del sys.modules[name]
    sys.modules.pop("transformers.integrations.npu_flash_attention", None)
    if hasattr(torch, "npu"):
        delattr(torch, "npu")
    import_utils = sys.modules.get("transformers.utils.import_utils")
    for probe in ("is_torch_npu_available", "_is_package_available"):
        cache_clear = getattr(getattr(import_utils, probe, None), "cache_clear", None)
        if cache_clear is not None:
            cache_clear()


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The fake torch_npu, imported fresh; its call log starts empty."""
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("a real torch_npu is installed; the fake would shadow it")
    monkeypatch.syspath_prepend(str(FAKE_DIR))
    _forget_torch_npu()
    module = importlib.import_module("torch_npu")
    module.reset()
    try:
        yield module
    finally:
        _forget_torch_npu()
