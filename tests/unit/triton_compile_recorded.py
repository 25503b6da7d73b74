"""Compile recorded interpreted triton launches (``triton_launch_record.py``) for an NVIDIA GPU, without
one: triton's bundled ptxas builds each distinct specialisation (signature and constexprs) for the
compute capability given, and one JSON line per build reports ``ok`` or the compiler's error.

    python triton_compile_recorded.py RECORD.jsonl [ARCH] [MODULE_PREFIX]

Kernels outside ``MODULE_PREFIX`` (default ``spec_backend``: the project's kernels) are left out. An int
argument equal to 1 is compiled as a constant, as the launcher specialises it; the launcher's alignment
hints (pointers and ints divisible by 16) are not reproduced, so a failure only those builds would show
is not caught here.
Run without ``TRITON_INTERPRET`` (under it ``triton.jit`` makes interpreted functions, which do not
compile); it is removed here before triton is imported.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

#: torch dtype names -> triton's pointer element types
ELEMENTS = {
    "float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64", "bool": "i1",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "uint32": "u32",
    "uint64": "u64",
}  # fmt: skip
#: launch keywords that are compiler options, not kernel arguments
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion", "num_ctas", "maxnreg")


def _argument_type(name: str, kind: list[Any]) -> str:
    if kind[0] == "ptr":
        return "*" + ELEMENTS[kind[1]]
    if kind[0] == "bool":
        return "i1"
    if kind[0] == "int":
        return "i32" if -(2**31) <= kind[1] < 2**31 else "i64"
    if kind[0] == "float":
        return "fp32"
    raise TypeError(f"argument {name} of kind {kind} has no triton type")


def specialisation(
    record: dict[str, Any],
) -> tuple[Any, dict[str, str], dict[tuple[int], Any], dict[str, Any]]:
    """The kernel, its signature, constexprs and compiler options for one recorded launch."""
    kernel = getattr(importlib.import_module(record["module"]), record["name"])
    args: dict[str, list[Any]] = record["args"]
    options = {name: args[name][1] for name in OPTIONS if name in args}
    signature: dict[str, str] = {}
    constexprs: dict[tuple[int], Any] = {}
    for index, param in enumerate(kernel.params):
        kind = args.get(param.name, ["default", param.default])
        ones = kind[0] == "int" and kind[1] == 1 and not param.do_not_specialize
        if param.is_constexpr or ones or kind[0] in ("none", "str", "default"):
            # an int argument equal to 1 is a constant of the build, as triton's launcher specialises it
            signature[param.name], constexprs[(index,)] = "constexpr", kind[1]
        else:
            signature[param.name] = _argument_type(param.name, kind)
    return kernel, signature, constexprs, options


def compile_records(lines: list[str], arch: int, prefix: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    done: set[str] = set()
    for line in lines:
        record = json.loads(line)
        if not record["module"].startswith(prefix):
            continue
        kernel, signature, constexprs, options = specialisation(record)
        key = json.dumps(
            [record["module"], record["name"], signature, repr(sorted(constexprs.items())), options]
        )
        if key in done:
            continue
        done.add(key)
        result = {"kernel": f"{record['module']}.{record['name']}", "signature": signature}
        try:
            source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
            triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
            result["ok"] = True
        except Exception as exc:  # reported per kernel: the test names every one that fails
            cause: BaseException = exc
            while cause.__cause__ is not None or cause.__context__ is not None:
                cause = cause.__cause__ or cause.__context__
            result["error"] = (
                f"{type(exc).__name__}: {str(exc)[-1000:]} (cause: {type(cause).__name__}: {cause})"
            )
        results.append(result)
    return results


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as recorded:
        lines = recorded.read().splitlines()
    arch = int(sys.argv[2]) if len(sys.argv) > 2 else 90
    for result in compile_records(lines, arch, sys.argv[3] if len(sys.argv) > 3 else "spec_backend"):
        print(json.dumps(result), flush=True)
