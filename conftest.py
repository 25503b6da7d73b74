"""Repository-wide test setup that must happen before any test module imports triton.

Without a GPU, triton kernels run under the interpreter; the variable is read when triton is
imported, so it is set here, above every test directory (tests/, backends/*/tests/).
Every test starts from seeded global RNGs. Hypothesis runs without per-example deadlines and
derandomized, so CI sees the same examples each run (HYPOTHESIS_PROFILE=default searches at random).
Markers and tier skips live in tests/conftest.py.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed_global_rngs() -> None:
    """Every test starts from the same global RNG state (python, numpy, torch), so any failure of a test
    that draws from them reproduces exactly, whatever ran before it."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


try:  # hypothesis is a test extra; property tests must not fail on a slow CI runner's timing
    from hypothesis import settings

    settings.register_profile("spec_backend", deadline=None, derandomize=True, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "spec_backend"))
except ImportError:  # pragma: no cover - only without the test extra
    pass
