"""Every triton kernel the CPU tests run interpreted also compiles for a GPU.

The interpreter (``TRITON_INTERPRET=1``) executes kernels as numpy and accepts code the compiler refuses
(an annotated ``@triton.jit`` helper, for one), so a kernel edited on a machine without a GPU could pass
every CPU test and fail at its first launch on one. Here the triton tests run again in a child pytest
that records each distinct launch (``triton_launch_record.py``: kernel, argument dtypes, constexprs,
compiler options), and each recorded specialisation of the project's kernels is compiled for compute
capability 9.0 with triton's bundled ptxas (``triton_compile_recorded.py``); no GPU is needed. Negative
control, through the same record and compile path: ``triton_broken_kernel.py`` runs interpreted and is
refused by the compiler. The check is per module (each module with kernels must have launches in the
record): a kernel of a listed module that no test launches is not compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: the test files whose launches are recorded, and the tests among them left out (they compile or spawn
#: processes themselves)
WORKLOAD = [
    "tests/unit/test_triton_sampler.py",
    "tests/unit/test_triton_fused_verify.py",
    "tests/unit/test_tree_ops.py",
    "backends/cuda/tests/test_cuda_triton_attention.py",
    "backends/cuda/tests/test_cuda_fused_kernels.py",
]
#: every module of the project that defines kernels: each must have launches in the record
KERNEL_MODULES = {
    "spec_backend.sampling.triton." + name
    for name in ("fused", "greedy", "rng", "softmax", "split", "tree", "tree_sampled", "verify")
} | {"spec_backend_cuda." + name for name in ("triton_attention", "fused_norm", "fused_mlp")}

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="a CUDA GPU compiles the kernels itself (the cuda test tier)"
)


def _compile(record: Path, prefix: str) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(ROOT / "backends" / "cuda"), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, str(HERE / "triton_compile_recorded.py"), str(record), "90", prefix],
        capture_output=True, text=True, env=env, timeout=1200,
    )  # fmt: skip
    if "ptxas" in done.stderr and "not found" in done.stderr.lower():
        pytest.skip("triton's NVIDIA compiler (ptxas) is not bundled with this triton")
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def _record(record: Path, targets: list[str], *selection: str) -> None:
    """Run ``targets`` in a child pytest that records every interpreted launch to ``record``."""
    env = {**os.environ, "SPEC_BACKEND_TRITON_RECORD": str(record), "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    workload = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "triton_launch_record",
         *selection, *targets],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800,
    )  # fmt: skip
    assert workload.returncode == 0, workload.stdout[-3000:]


def test_every_interpreted_kernel_compiles_for_a_gpu(tmp_path: Path) -> None:
    record = tmp_path / "launches.jsonl"
    _record(record, WORKLOAD, "-k", "not compiles and not 64_bit")
    launched = {json.loads(line)["module"] for line in record.read_text().splitlines()}
    assert launched >= KERNEL_MODULES, f"no launches recorded from {sorted(KERNEL_MODULES - launched)}"
    results = _compile(record, "spec_backend")
    failed = [r for r in results if "error" in r]
    assert not failed, "\n".join(f"{r['kernel']} {r['signature']}: {r['error']}" for r in failed)
    assert {r["kernel"].rsplit(".", 1)[0] for r in results} == KERNEL_MODULES


def test_the_broken_kernel_runs_interpreted() -> None:
    """``doubled_kernel`` doubles its input under the interpreter (the negative control's workload)."""
    import triton_broken_kernel  # the test session's interpreter (TRITON_INTERPRET=1 by the root conftest)

    values = torch.arange(5, dtype=torch.float32)
    out = torch.empty_like(values)
    triton_broken_kernel.doubled_kernel[(1,)](values, out, 5, BLOCK=8)
    assert torch.equal(out, values * 2)


def test_a_kernel_the_interpreter_runs_and_the_compiler_refuses_is_caught(tmp_path: Path) -> None:
    """The negative control, through the same path as the check: a child pytest records the interpreted
    launch of ``doubled_kernel`` (its test passes), and compiling the record reports the refusal."""
    record = tmp_path / "launches.jsonl"
    _record(record, [f"{Path(__file__).relative_to(ROOT)}::test_the_broken_kernel_runs_interpreted"])
    [result] = _compile(record, "triton_broken_kernel")
    assert "CompilationError" in result["error"] and "global variable Any" in result["error"], result


def test_the_widest_fused_kernels_compile(tmp_path: Path) -> None:
    """The fused RMSNorm at its widest hidden size (``MAX_HIDDEN``, one row in registers, 16 warps) and
    the gating kernel at its widest tile (1024), in bfloat16 and float32: sizes no CPU test launches."""
    record = tmp_path / "launches.jsonl"
    lines = []
    for dtype in ("bfloat16", "float32"):
        norm = {
            "x_ptr": ["ptr", dtype], "w_ptr": ["ptr", dtype], "out_ptr": ["ptr", dtype], "rows": ["int", 64],
            "hidden": ["int", 16384], "sx": ["int", 16384], "so": ["int", 16384], "eps": ["float", 1e-5],
            "BLOCK": ["int", 16384], "num_warps": ["int", 16],
        }  # fmt: skip
        gating = {
            "x_ptr": ["ptr", dtype], "out_ptr": ["ptr", dtype], "width": ["int", 8192], "sx": ["int", 16384],
            "so": ["int", 8192], "BLOCK": ["int", 1024],
        }  # fmt: skip
        for module, name, args in (
            ("fused_norm", "_rms_norm_kernel", norm),
            ("fused_mlp", "_silu_and_mul_kernel", gating),
        ):
            lines.append(json.dumps({"module": f"spec_backend_cuda.{module}", "name": name, "args": args}))
    record.write_text("\n".join(lines) + "\n")
    results = _compile(record, "spec_backend_cuda")
    assert len(results) == 4 and all(r.get("ok") for r in results), results
