"""Native-kernel tests run once per ISA variant of the cpu backend's kernels (``spec_backend/cpu/isa.py``):
every variant of this machine's architecture is a parameter; an instance skips only where this CPU lacks
the variant's instructions (saying which), so an AVX2-only machine runs the avx2 and generic instances
and skips none of them for lack of AVX-512."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from engine_fixtures import require_native_kernels

from spec_backend.cpu.isa import ISA_ENV, machine_variants, missing_flags, variant
from spec_backend.cpu.native import active_variant, variant_error

#: every ISA variant of this machine's architecture, fastest first
VARIANTS = [v.name for v in machine_variants()]


def compile_every_source(compiler: str, name: str, out: Path) -> None:
    """Compile (``-c``, in parallel) every ``csrc/*.cpp`` as variant ``name`` with the kernels' flags
    against this torch's headers, objects into ``out``; a source that does not compile fails the test
    with the compiler's last words."""
    from torch.utils.cpp_extension import include_paths

    from spec_backend.cpu import native

    flags = [*native.build_flags(variant(name)), *(f"-I{p}" for p in include_paths())]
    sources = sorted((Path(native.__file__).parent / "csrc").glob("*.cpp"))
    jobs = [
        subprocess.Popen(
            [compiler, "-std=c++20", "-fPIC", "-c", str(s), "-o", str(out / f"{s.stem}.o"), *flags],
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in sources
    ]
    for source, job in zip(sources, jobs, strict=True):
        _, err = job.communicate(timeout=900)
        assert job.returncode == 0, f"{source.name}: {err[-2000:]}"


def use_variant(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Select variant ``name`` for the rest of the test (``SPEC_BACKEND_ISA``); skip where this CPU cannot
    run it. Where it can, it must build (a compiler that fails there is a defect, not a reason to skip)."""
    missing = missing_flags(variant(name))
    if missing:
        pytest.skip(f"this CPU cannot run the {name} kernels: it lacks {', '.join(missing)}")
    require_native_kernels()
    monkeypatch.setenv(ISA_ENV, name)
    error = variant_error(name)
    assert error is None, f"the {name} kernels do not build: {error}"
    selected = active_variant()
    assert selected is not None and selected.name == name
    return name


@pytest.fixture(params=VARIANTS)
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ISA variant this test instance runs (module docstring)."""
    return use_variant(str(request.param), monkeypatch)


__all__ = ["VARIANTS", "isa", "use_variant"]
