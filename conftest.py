"""Repository-wide test setup that must happen before any test module imports triton.

Without a GPU, triton kernels run under the interpreter; the variable is read when triton is
imported, so it is set here, above every test directory (tests/, backends/*/tests/).
Markers and tier skips live in tests/conftest.py.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
