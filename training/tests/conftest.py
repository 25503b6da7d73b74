"""Setup of the training tests: each module runs on one intra-op thread.

The training distribution's tests stand on their own (``pytest training/tests``); the repository-wide
conftest.py above them seeds the RNGs and sets triton's interpreter for every test directory.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models train and run fastest (and least disturbed by other processes) on one intra-op thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
