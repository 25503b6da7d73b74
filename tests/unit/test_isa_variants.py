"""The ISA variants of the cpu backend's native kernels (``cpu/isa.py``, ``cpu/native.py``): which ones a
CPU runs from its flags, the ``SPEC_BACKEND_ISA`` cap and its refusal, the fallback when a variant does
not build and the reasons given for the choice, the Q4_1 product's identical bits on every variant,
the AVX-VNNI variant compiling where this CPU cannot run it, and no variant exporting its code."""

from __future__ import annotations

import platform
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_fixtures import require_native_kernels
from isa_fixtures import VARIANTS, compile_every_source, use_variant

from spec_backend.cpu import isa, native
from spec_backend.cpu.backend import CpuBackend
from spec_backend.cpu.int4_linear import Int4Linear, quantize_int4
from spec_backend.cpu.isa import ISA_ENV, machine_variants, missing_flags, runnable_variants, variant

X86 = platform.machine() in ("x86_64", "AMD64", "amd64")
#: what ``/proc/cpuinfo`` says on a common AVX2-only x86-64 CPU (Haswell, Zen 1-3)
AVX2_ONLY = frozenset(
    [
        "fpu",
        "sse",
        "sse2",
        "ssse3",
        "sse4_1",
        "sse4_2",
        "avx",
        "f16c",
        "fma",
        "avx2",
        "bmi1",
        "bmi2",
        "abm",
        "movbe",
    ]
)


@pytest.fixture(autouse=True)
def fresh_selection() -> Iterator[None]:
    """Selections are cached per environment value; tests that fake a build see a fresh one."""
    native._selection.cache_clear()
    yield
    native._selection.cache_clear()


def test_variants_are_ordered_fastest_first_with_their_own_namespaces() -> None:
    assert (
        len({v.namespace for v in isa.VARIANTS}) == len({v.macro for v in isa.VARIANTS}) == len(isa.VARIANTS)
    )
    assert [v.name for v in machine_variants("x86_64")] == ["avx512_vnni", "avx_vnni", "avx2", "generic"]
    assert [v.name for v in machine_variants("aarch64")] == ["neon_dotprod", "neon", "generic"]
    assert variant("avx2").namespace == "spec_backend_avx2" and variant("avx2").macro == "SPEC_ISA_AVX2"
    with pytest.raises(
        ValueError,
        match="unknown ISA variant 'sse9'; known: avx512_vnni, avx_vnni, avx2, neon_dotprod, neon, generic",
    ):
        variant("sse9")


@pytest.mark.skipif(not X86, reason="x86-64 CPU flags")
def test_an_avx2_only_cpu_runs_the_avx2_and_generic_variants() -> None:
    assert [v.name for v in runnable_variants(AVX2_ONLY)] == ["avx2", "generic"]
    assert missing_flags(variant("avx512_vnni"), AVX2_ONLY) == (
        "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
    )  # fmt: skip
    assert missing_flags(variant("avx_vnni"), AVX2_ONLY) == ("avx_vnni",)
    assert [v.name for v in runnable_variants(frozenset({"sse2", "avx"}))] == ["generic"]


def test_the_cap_selects_a_variant_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    require_native_kernels()
    best = runnable_variants()[0].name
    assert native.selection().reason == "the fastest variant this CPU runs"
    monkeypatch.setenv(ISA_ENV, "generic")
    chosen = native.selection()
    assert chosen.variant is not None and chosen.variant.name == "generic"
    expected = f"{ISA_ENV}=generic caps it" + ("" if best == "generic" else f"; this CPU runs up to {best}")
    assert chosen.reason == expected
    status = CpuBackend().probe()
    assert status.available and status.reason.startswith(f"generic kernels: {expected}")
    assert CpuBackend().describe()["kernels"] == f"generic ({expected})"


def test_an_unknown_cap_is_refused_with_the_allowed_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ISA_ENV, "sse9")
    allowed = ", ".join(v.name for v in machine_variants())
    machine = platform.machine()
    message = f"{ISA_ENV} must name an ISA variant of this {machine} machine, one of {allowed}; got 'sse9'"
    with pytest.raises(ValueError, match=message):
        native.selection()
    assert str(CpuBackend().probe()) == f"unavailable: {message}"


def test_a_variant_that_does_not_build_falls_back_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    require_native_kernels()
    runnable = [v.name for v in runnable_variants()]
    if len(runnable) < 2:
        pytest.skip(f"this CPU runs only {runnable}")
    broken = {runnable[0]: "RuntimeError: Error building extension (error: unknown flag)"}
    load = native._load
    monkeypatch.setattr(native, "_load", lambda name: broken.get(name) or load(name))
    native._selection.cache_clear()
    chosen = native.selection()
    assert chosen.variant is not None and chosen.variant.name == runnable[1]
    assert (
        chosen.reason
        == f"{runnable[0]} did not build ({broken[runnable[0]]}); this CPU runs up to {runnable[0]}"
    )
    native._selection.cache_clear()
    broken.update({name: f"RuntimeError: no {name}" for name in runnable})
    assert native.native_kernel_error() == "; ".join(f"{name}: {broken[name]}" for name in runnable)
    status = CpuBackend().probe()
    assert not status.available and status.reason.startswith("the native CPU kernels do not build here: ")


def test_the_q4_1_product_gives_the_same_bits_on_every_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact integer block dots and the same two FMAs per block on every variant (``csrc/q4_1.h``): each
    variant this CPU runs gives the first one's output bit for bit, for 1 to 9 rows (row tiles of 5 and
    their remainders); a variant bound to a layer stays bound when the cap changes."""
    runnable = [v.name for v in runnable_variants()]
    linear = torch.nn.Linear(96, 48, bias=False)
    found = quantize_int4(torch.randn(48, 96, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(9, 96, generator=torch.Generator().manual_seed(1))  # [M, K]
    layers = {
        name: Int4Linear(linear, *found, kernel="native")
        for name in runnable
        if use_variant(name, monkeypatch)
    }
    assert {name: layer.isa for name, layer in layers.items()} == {name: name for name in runnable}
    with torch.no_grad():
        first = {m: layers[runnable[0]](x[:m]) for m in range(1, 10)}
        for name in runnable[1:]:
            for m in range(1, 10):
                assert torch.equal(layers[name](x[:m]), first[m]), (name, m)


@pytest.mark.skipif(not X86, reason="an x86 variant")
def test_the_avx_vnni_variant_compiles(tmp_path: Path) -> None:
    """Every source compiles as the AVX-VNNI variant (its Q4_1 tile in ``csrc/q4_1_avx256.h``, its 256-bit
    vectors), also where this CPU cannot run it (there its kernel tests skip); a compiler without
    ``-mavxvnni`` (GCC < 11) is the only skip."""
    from torch.utils.cpp_extension import get_cxx_compiler

    compiler = shutil.which(get_cxx_compiler())
    if compiler is None:
        pytest.skip("no C++ compiler")
    probe = subprocess.run(
        [compiler, "-mavxvnni", "-E", "-x", "c++", "-"], input="", capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"{compiler} does not know -mavxvnni: {probe.stderr.strip()[:200]}")
    compile_every_source(compiler, "avx_vnni", tmp_path)
    dump = shutil.which("objdump")
    if dump is not None:  # the VEX-encoded dot product is there
        disassembly = subprocess.run(
            [dump, "-d", str(tmp_path / "q4_1_mm.o")], capture_output=True, text=True
        )
        assert "vpdpbusd" in disassembly.stdout


@pytest.mark.parametrize("name", VARIANTS)
def test_no_variant_exports_its_code(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built with hidden visibility: two variants loaded side by side never call each other's functions
    (an AVX-512 helper inside a run capped to AVX2)."""
    use_variant(name, monkeypatch)
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm")
    (library,) = native.build_folder(variant(name)).glob("*.so")
    symbols = subprocess.run(
        [nm, "-DC", "--defined-only", str(library)], capture_output=True, text=True
    ).stdout
    assert "spec_backend_native" not in symbols and "q4_1_q8_mm" not in symbols


def test_nothing_of_a_variant_this_cpu_cannot_run_is_loaded() -> None:
    lacking = [v for v in machine_variants() if missing_flags(v)]
    if not lacking:
        pytest.skip("this CPU runs every variant of its architecture")
    for v in lacking:
        assert native.variant_error(v.name) == f"this CPU lacks {', '.join(missing_flags(v))}"
        assert native.native_op("q4_1_q8_mm", v.name) is None
        assert not hasattr(torch.ops, v.namespace) or not hasattr(
            getattr(torch.ops, v.namespace), "q4_1_q8_mm"
        )
