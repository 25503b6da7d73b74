"""Compile the triton attention kernel for NVIDIA targets without a GPU and report each build's shared
memory, one JSON line per configuration: ``{"case": ..., "shared": bytes}`` or ``{"case": ..., "error":
text}``. Run by ``test_cuda_triton_attention.py`` in a fresh process, without ``TRITON_INTERPRET`` (under
it ``triton.jit`` makes interpreted functions, which do not compile).

    python compile_triton_attention.py '[["bfloat16", 15, 64, 64, 90, null, true]]'

Each case: dtype, rows (query heads of a group x query tokens), head dim, value head dim, compute
capability (80, 90), tiles to force (``[block_m, block_n, num_stages]``) or null for the kernel's own
``launch_config``, and whether the window, soft cap and sink branches are on (all) or off (none).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton
from spec_backend_cuda import triton_attention
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def build(case: list[object]) -> dict[str, object]:
    dtype, rows, head_dim, value_dim, arch, forced, flags = case
    assert (
        isinstance(dtype, str) and isinstance(rows, int) and isinstance(arch, int) and isinstance(flags, bool)
    )
    assert isinstance(head_dim, int) and isinstance(value_dim, int)
    tiles = triton_attention.launch_config(getattr(torch, dtype), rows, head_dim, value_dim)
    block_m, block_n, stages = (
        forced if isinstance(forced, list) else (tiles.block_m, tiles.block_n, tiles.num_stages)
    )
    kernel = triton_attention._ragged_attention_kernel
    signature: dict[str, str] = {}
    for name in kernel.arg_names:
        if name.endswith("_ptr"):
            signature[name] = {"q_lens_ptr": "*i64", "kv_lens_ptr": "*i64", "sinks_ptr": "*fp32"}.get(
                name, f"*{TYPES[dtype]}"
            )
        elif name.isupper():
            signature[name] = "constexpr"
        else:  # as triton's launcher types an int that fits 32 bits (the test shapes' strides do)
            signature[name] = "fp32" if name in ("scale", "softcap") else "i32"
    constants = {
        "HAS_SINKS": flags, "HAS_SOFTCAP": flags, "HAS_WINDOW": flags,  # every branch of the kernel, or none
        "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": tiles.block_d, "BLOCK_DV": tiles.block_dv,
    }  # fmt: skip
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(n),): v for n, v in constants.items()},
    )
    try:
        built = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_stages": stages})
    except Exception as exc:  # reported to the test, which names the case
        return {"case": case, "error": f"{type(exc).__name__}: {exc}"[-2000:]}
    return {"case": case, "shared": int(built.metadata.shared)}


if __name__ == "__main__":
    for case in json.loads(sys.argv[1]):
        print(json.dumps(build(case)), flush=True)
