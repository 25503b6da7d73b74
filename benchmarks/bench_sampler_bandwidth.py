"""Rejection sampler vs the memory-bandwidth floor: µs per call and % of the floor, triton vs torch.

For every (B, K) the standard mode (temperature 1, point-mass drafts, seeded) verifies float32 logits
``[B·(K+1), V]``. The *floor* is the time to read those logits once at the device's bandwidth, measured
in the same run by a device-to-device copy (``dst.copy_(src)`` of a 1 GiB buffer: 2 bytes moved per
byte copied). ``% of floor`` = floor / measured time: 100 % means the sampler costs one read of the
logits. Times are medians of CUDA-event timings (``--device cuda``) or ``perf_counter`` (CPU).

    python benchmarks/bench_sampler_bandwidth.py                        # on a GPU: the full grid
    python benchmarks/bench_sampler_bandwidth.py --vocab-blocks 1024,2048,4096,8192   # tile sweep
    python benchmarks/bench_sampler_bandwidth.py --device cpu --quick   # dry path (torch only on CPU)

Implementations: ``triton`` — the CUDA backend's ops (``TritonSamplerOps`` with its tuning, or each
``--vocab-blocks`` value); ``torch`` — the reference backend's ``TorchSamplerOps`` on the same device.
On CPU the triton kernels would run interpreted (minutes): they are skipped unless ``--with-triton``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a bare checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends" / "cuda"))

from spec_backend.backends.base import SamplerTuning
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata
from spec_backend.sampling.ops import SamplerOps

BATCHES = (1, 8, 64, 256)
SPEC_TOKENS = (1, 4, 8)
VOCAB = 151936


class _OpsBackend(ReferenceBackend):
    """The reference backend with other sampler ops (the sampler only asks for ops and limits)."""

    def __init__(self, ops: SamplerOps) -> None:
        self._ops = ops

    def sampler_ops(self) -> SamplerOps:
        return self._ops

    def sampler_tuning(self) -> SamplerTuning:
        return SamplerTuning(group_elements=None)  # one pass over the batch, as on a GPU


def timer(device: str, warmup: int, iters: int) -> Callable[[Callable[[], object]], float]:
    """Median seconds of ``fn()`` over ``iters`` runs after ``warmup`` runs."""

    def measure(fn: Callable[[], object]) -> float:
        for _ in range(warmup):
            fn()
        samples = []
        if device == "cuda":
            torch.cuda.synchronize()
            for _ in range(iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3)
        else:
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    return measure


def copy_bandwidth(device: str, measure: Callable[[Callable[[], object]], float], nbytes: int) -> float:
    """Bytes per second of a device-to-device copy (read + write both counted)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    seconds = measure(lambda: dst.copy_(src))
    return 2 * nbytes / seconds


def make_inputs(
    batch: int, k: int, vocab: int, device: str
) -> tuple[SpecDecodeMetadata, torch.Tensor, SamplingMetadata]:
    gen = torch.Generator(device=device).manual_seed(batch * 100 + k)
    logits = torch.randn(batch * (k + 1), vocab, device=device, generator=gen) * 3  # [B·(K+1), V]
    drafts = torch.randint(0, vocab, (batch, k), device=device, generator=gen).tolist()
    meta = SpecDecodeMetadata.from_draft_tokens(drafts, device)
    sampling = SamplingMetadata.random(batch, temperature=1.0, seed=7, position=100, device=device)
    return meta, logits, sampling


def implementations(device: str, blocks: list[int] | None, with_triton: bool) -> dict[str, SamplerOps]:
    from spec_backend.sampling.torch_ops import TorchSamplerOps

    impls: dict[str, SamplerOps] = {"torch": TorchSamplerOps()}
    if device == "cpu" and not with_triton:
        return impls
    from spec_backend_cuda import CudaBackend

    from spec_backend.sampling.triton_ops import TritonSamplerOps

    tuning = CudaBackend().sampler_tuning()
    for block in blocks or [tuning.vocab_block]:
        cfg = SamplerTuning(
            vocab_block=block, max_grid=tuning.max_grid, device_uniforms=tuning.device_uniforms
        )
        impls[f"triton/{block}"] = TritonSamplerOps(cfg)
    return impls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small grid and vocabulary (dry run)")
    parser.add_argument("--vocab-blocks", default="", help="comma-separated triton tiles to sweep")
    parser.add_argument("--with-triton", action="store_true", help="on CPU: run the interpreted kernels")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU (use --device cpu --quick for the dry path)")
    if device == "cpu" and args.with_triton:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    batches, ks, vocab = (BATCHES, SPEC_TOKENS, VOCAB) if not args.quick else ((1, 8), (1, 4), 4096)
    iters, warmup = (args.iters, 10) if not args.quick else (5, 2)
    blocks = [int(b) for b in args.vocab_blocks.split(",") if b] or None
    measure = timer(device, warmup, iters)
    bandwidth = copy_bandwidth(device, measure, (1 << 30) if not args.quick else (1 << 24))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, copy bandwidth {bandwidth / 1e9:.0f} GB/s, V={vocab}")
    impls = implementations(device, blocks, args.with_triton)
    header = f"{'B':>4} {'K':>2} {'logits MiB':>10} {'floor µs':>9}"
    header += "".join(f" {n + ' µs':>15} {'% floor':>8}" for n in impls)
    print(header)
    for batch in batches:
        for k in ks:
            meta, logits, sampling = make_inputs(batch, k, vocab, device)
            nbytes = logits.numel() * logits.element_size()
            floor = nbytes / bandwidth
            row = f"{batch:>4} {k:>2} {nbytes / 2**20:>10.1f} {floor * 1e6:>9.1f}"
            outputs = {}
            for impl_name, ops in impls.items():
                sampler = RejectionSampler(backend=_OpsBackend(ops))
                seconds = measure(lambda s=sampler, m=meta, x=logits, p=sampling: s(m, None, x, p))
                outputs[impl_name] = sampler(meta, None, logits, sampling)
                row += f" {seconds * 1e6:>15.1f} {100 * floor / seconds:>7.1f}%"
            ref = outputs["torch"]
            mismatch = [n for n, out in outputs.items() if not torch.equal(out, ref)]
            print(row + (f"  (differs from torch: {', '.join(mismatch)})" if mismatch else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
