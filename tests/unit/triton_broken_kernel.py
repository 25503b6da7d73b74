# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""A kernel the triton interpreter runs and the compiler refuses: the negative control of
``test_triton_kernels_compile.py`` (its helper is annotated, and a compiled kernel resolves the
annotation's name as a global, which triton allows only for constexprs)."""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _double(x: Any) -> Any:
    return x * 2


@triton.jit
def doubled_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    values = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(out_ptr + offsets, _double(values), mask=offsets < n)
