"""The ARM (aarch64) ISA variants of the cpu backend's kernels (``spec_backend/cpu/isa.py``: ``neon_dotprod``,
``neon``, ``generic``), tested on this x86 machine under emulation, since no ARM machine is here.

Standalone programs (``arm_kernels/*_driver.cpp``, no torch) include the kernel headers: the Q4_1 x int8
tile the variant's build picks (``csrc/q4_1_tile.h``) and the 16-lane vectors (``csrc/vec16.h``). Each is
built once per variant, ARM ones with ``aarch64-linux-gnu-g++`` and run under ``qemu-aarch64 -cpu max``,
x86 ones with the host's ``g++`` (the generic build always, the SIMD ones this CPU runs), on fixed
pseudo-random inputs; every output is compared bit for bit with an exact float32 reference computed here
(``arm_kernels/q4_1_case.py``, ``arm_kernels/vec16_case.py``) and with the x86 generic build's. The Q4_1
tile gives the same bits on every variant (exact integer dot products, the same two FMAs per block);
``vec16``'s lane-wise ``a * b + c`` is one FMA on ARM and on x86's SIMD builds but two roundings on x86's
generic build (no FMA instruction), so there the ARM builds equal the fused reference and the x86 generic
build the unfused one. Every ``csrc/*.cpp`` also compiles as each ARM variant against torch's headers.

Not tested here: speed (no ARM machine), the built torch extension on ARM (torch's aarch64 libraries are
not installed), OpenMP threading. Without the cross compiler or qemu the ARM tests skip, naming
``scripts/setup_arm_emulation.sh``."""

from __future__ import annotations

import platform
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from arm_kernels.harness import (
    CROSS_CXX,
    CROSS_OBJDUMP,
    Program,
    build,
    compile_command,
    emulation_missing,
)
from arm_kernels.q4_1_case import TILE_BYTES, make_case, parse_output, show, with_code_byte, with_scales
from arm_kernels.vec16_case import make_vec_case, parse_vec_output
from isa_fixtures import compile_every_source

from spec_backend.cpu.isa import ISA_ENV, isa_cap, machine_variants, missing_flags, variant

X86 = platform.machine() in ("x86_64", "AMD64", "amd64")
ARM_VARIANTS = [v.name for v in machine_variants("aarch64")]
#: this host's x86 builds: generic always, the SIMD variants only where this CPU runs them
HOST_VARIANTS = ["generic"] + [
    v.name for v in machine_variants("x86_64") if v.name != "generic" and X86 and not missing_flags(v)
]
BUILDS = [f"arm:{name}" for name in ARM_VARIANTS] + [f"host:{name}" for name in HOST_VARIANTS]
#: what /proc/cpuinfo says on an Armv8.0 core without dot products (a Cortex-A53 with crypto extensions)
CORTEX_A53 = frozenset(["fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "cpuid"])

Build = Callable[[str, str], Program]


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """``program(driver, build)``: ``arm_kernels/<driver>_driver.cpp`` built as ``build`` (``arm:<variant>``
    or ``host:<variant>``), once per module; ARM builds skip where the cross compiler or qemu is missing,
    host builds where this is not an x86 machine or it has no g++."""
    folder = tmp_path_factory.mktemp("arm_kernels")
    built: dict[tuple[str, str], Program] = {}

    def get(driver: str, name: str) -> Program:
        where, _, variant_name = name.partition(":")
        reason = emulation_missing() if where == "arm" else None
        if where == "host" and not X86:
            reason = f"the host builds are x86 ones; this is {platform.machine()}"
        elif where == "host" and shutil.which("g++") is None:
            reason = "no g++ on this machine"
        if reason is not None:
            pytest.skip(reason)
        if (driver, name) not in built:
            built[(driver, name)] = build(driver, variant(variant_name), folder, arm=where == "arm")
        return built[(driver, name)]

    return get


def ran(program: Program, stdin: str, cpu: str = "max") -> str:
    """The program's output on ``stdin``; it must exit cleanly."""
    done = program.run(stdin, cpu)
    assert done.returncode == 0, f"{program.path.name} exited with {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


def needs_emulation() -> None:
    """Skips, saying why, where ARM programs cannot be built and run."""
    reason = emulation_missing()
    if reason is not None:
        pytest.skip(reason)


def test_the_arm_variants_are_listed_fastest_first_with_their_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for machine in ("aarch64", "arm64"):
        assert [v.name for v in machine_variants(machine)] == ["neon_dotprod", "neon", "generic"]
    assert [v.name for v in machine_variants("x86_64")] == ["avx512_vnni", "avx_vnni", "avx2", "generic"]
    dotprod, neon = variant("neon_dotprod"), variant("neon")
    assert (dotprod.cpu_flags, dotprod.cflags) == (("asimd", "asimddp"), ("-march=armv8.2-a+dotprod",))
    assert (neon.cpu_flags, neon.cflags) == (("asimd",), ("-march=armv8-a",))
    assert (dotprod.macro, dotprod.namespace) == ("SPEC_ISA_NEON_DOTPROD", "spec_backend_neon_dotprod")
    assert missing_flags(dotprod, CORTEX_A53) == ("asimddp",)
    assert missing_flags(neon, CORTEX_A53) == ()
    assert missing_flags(dotprod, CORTEX_A53 | {"asimddp"}) == ()
    if X86:  # an ARM variant is no cap on x86
        monkeypatch.setenv(ISA_ENV, "neon")
        with pytest.raises(ValueError, match=r"one of avx512_vnni, avx_vnni, avx2, generic; got 'neon'"):
            isa_cap()


@pytest.mark.parametrize("name", BUILDS)
def test_the_q4_1_tile_gives_the_exact_reference_bits(name: str, program: Build) -> None:
    """Every row tile R = 1 .. 5 of the build gives, bit for bit, the exact float32 reference and the x86
    generic build's output, extreme dot products (+-60960) included."""
    case = make_case(seed=0)
    text = ran(program("q4_1", name), case.stdin())
    outputs, expected = parse_output(text), case.reference()
    assert sorted(outputs) == [1, 2, 3, 4, 5]
    for rows, out in outputs.items():
        assert len(out) == case.rows
        for i, (got, want) in enumerate(zip(out, expected, strict=True)):
            bad = [n for n, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
            assert not bad, f"R={rows} row {i} out {bad[0]}: {show(got[bad[0]])} != {show(want[bad[0]])}"
    if name != "host:generic":
        assert text == ran(program("q4_1", "host:generic"), case.stdin())


@pytest.mark.parametrize("name", BUILDS)
def test_binary16_scales_give_the_bits_of_their_float32_values(name: str, program: Build) -> None:
    """Scales and minima given as binary16 (as a GGUF Q4_1 file stores them; the kernel converts them
    exactly, a fifth fewer bytes per weight) give, for every row tile, the exact reference of their values
    and what the float32 tile prints for them, subnormals, signed zeros and +-65504 included. Negative
    control: flushing the subnormals to zero, as a converter without subnormals would, changes the
    reference, so the test would catch it."""
    case = make_case(seed=1, half=True)
    text = ran(program("q4_1", name), case.stdin(half=True))
    assert text == ran(program("q4_1", name), case.stdin())
    expected = case.reference()
    for rows, out in parse_output(text).items():
        assert out == expected, f"R={rows} differs from the exact reference"
    flushed = with_scales(case, lambda f: 0.0 if 0 < abs(f) < 2.0**-14 else f)
    assert flushed.reference() != expected


@pytest.mark.parametrize("name", [f"arm:{name}" for name in ARM_VARIANTS])
def test_a_changed_code_or_a_wrong_nibble_order_shows(name: str, program: Build) -> None:
    """Negative controls: one changed code byte (tile 1, block 2, part 1, feature 5) changes that feature's
    outputs and nothing else, as the reference says; a reference that reads the nibbles the other way
    round differs from what the kernels print."""
    case = make_case(seed=0)
    first = parse_output(ran(program("q4_1", name), case.stdin()))[4]
    index = (1 * case.groups + 2) * TILE_BYTES + 64 * 1 + 4 * 5 + 2
    changed = with_code_byte(case, index, case.codes[index] ^ 0x5A)
    second = parse_output(ran(program("q4_1", name), changed.stdin()))[4]
    assert second == changed.reference()
    moved = {(i, n) for i in range(case.rows) for n in range(16 * case.tiles) if first[i][n] != second[i][n]}
    assert moved and {n for _, n in moved} == {16 * 1 + 5}
    swapped = case.reference(swap_nibbles=True)
    assert any(a != b for got, bad in zip(first, swapped, strict=True) for a, b in zip(got, bad, strict=True))


def test_only_the_dotprod_variant_needs_dot_product_instructions(program: Build) -> None:
    """On an emulated Cortex-A53 (Armv8.0: no ``sdot``) the neon build gives the same output as on
    ``-cpu max`` and the neon_dotprod build dies of an illegal instruction; the disassembly shows
    ``sdot`` in the one and widening ``smlal`` in the other."""
    case = make_case(seed=1)
    neon, dotprod = program("q4_1", "arm:neon"), program("q4_1", "arm:neon_dotprod")
    assert ran(neon, case.stdin(), cpu="cortex-a53") == ran(neon, case.stdin())
    died = dotprod.run(case.stdin(), cpu="cortex-a53")
    assert died.returncode != 0 and "Illegal instruction" in died.stderr, (died.returncode, died.stderr)
    objdump = shutil.which(CROSS_OBJDUMP)
    if objdump is None:
        pytest.skip(f"{CROSS_OBJDUMP} not installed (binutils-aarch64-linux-gnu)")
    code = {
        p: subprocess.run([objdump, "-d", str(p.path)], capture_output=True, text=True).stdout
        for p in (neon, dotprod)
    }
    assert "\tsdot\t" in code[dotprod] and "\tsdot\t" not in code[neon]
    assert "\tsmlal" in code[neon]


def test_a_variant_macro_without_its_flags_is_refused(tmp_path: Path) -> None:
    """``csrc/isa.h`` refuses ``SPEC_ISA_NEON_DOTPROD`` built without ``+dotprod`` and ``SPEC_ISA_NEON``
    built by an x86 compiler, saying what is needed (rather than a build that mislabels itself)."""
    needs_emulation()
    cases = [
        (
            variant("neon_dotprod"),
            True,
            ("-march=armv8-a",),
            "SPEC_ISA_NEON_DOTPROD needs an aarch64 compiler",
        ),
        (variant("neon"), False, (), "SPEC_ISA_NEON needs an aarch64 compiler"),
    ]
    for v, arm, cflags, message in cases:
        command = compile_command("q4_1", v, tmp_path / v.name, arm, cflags)
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("name", BUILDS)
def test_vec16_gives_the_exact_reference_bits(name: str, program: Build) -> None:
    """sum16 in its fixed order, the attention dot product and exp16, bit for bit: fused (one FMA per
    ``a * b + c``) on every ARM build and x86 SIMD build, unfused on x86's generic build; sum16 (additions
    only) the same on all. The inputs tell fused from unfused apart (negative control)."""
    case = make_vec_case(seed=0)
    got = parse_vec_output(ran(program("vec16", name), case.stdin()))
    fused = name != "host:generic"
    assert case.dots(True) != case.dots(False) and case.exps(True) != case.exps(False)
    assert got["sum16"] == case.sum16()
    assert got["dot"] == case.dots(fused)
    assert got["exp"] == case.exps(fused)


@pytest.mark.parametrize("name", ARM_VARIANTS)
def test_every_source_compiles_as_the_arm_variant(name: str, tmp_path: Path) -> None:
    """Every ``csrc/*.cpp`` compiles (``-c``) as ARM variant ``name`` with the kernels' flags against this
    torch's headers (torch's headers are the same on every architecture; its aarch64 libraries, which a
    link would need, are not installed); the neon_dotprod Q4_1 op holds ``sdot``."""
    needs_emulation()
    compile_every_source(CROSS_CXX, name, tmp_path)
    objdump = shutil.which(CROSS_OBJDUMP)
    if name == "neon_dotprod" and objdump is not None:
        code = subprocess.run([objdump, "-d", str(tmp_path / "q4_1_mm.o")], capture_output=True, text=True)
        assert "\tsdot\t" in code.stdout
