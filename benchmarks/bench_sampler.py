"""Rejection-sampler benchmark: the package's sampler vs a naive per-request Python-loop torch sampler.

For every (V, B, K, mode) it prints the median µs per call after warm-up, the effective bandwidth
(bytes of logits + draft probs, read once, divided by the time) and the speed-up over the baseline,
measured in the same run on the same inputs.

    python benchmarks/bench_sampler.py                  # full grid (CPU: < 10 min on 2 cores)
    python benchmarks/bench_sampler.py --quick          # a small subset
    python benchmarks/bench_sampler.py --device cuda --markdown
    python benchmarks/bench_sampler.py --device cuda --impl triton   # the shared triton kernels

``--impl`` picks the sampler ops being timed: ``torch`` (default: the loaded backend's ops) or ``triton``
(``TritonSamplerOps`` with ``--vocab-block`` / ``--max-grid``, on a GPU; on CPU only under
``TRITON_INTERPRET=1`` with tiny shapes).

Modes: greedy (temperature 0), standard, block (lossless), cumulative, entropy, synthetic. Inputs:
float32 logits [B·(K+1), V] and float32 draft probs [B·K, V] (greedy and synthetic read no draft probs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch

from spec_backend.config.rejection import RejectionSamplerConfig
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata

if TYPE_CHECKING:
    from spec_backend.backends.base import Backend

MODES = ("greedy", "standard", "block", "cumulative", "entropy", "synthetic")
RATES = [0.8, 0.6, 0.45, 0.35, 0.25, 0.2, 0.15, 0.1]
THETA, ALPHA = 0.95, 0.4
SLOW_S = 1.0
FMT = "{:>7} {:>4} {:>2} {:>10} {:>10} {:>10} {:>6} {:>14} {:>9}"


def make_backend(
    impl: str, vocab_block: int = 4096, max_grid: int | None = None, group_elements: int | None = None
) -> Backend:
    """The backend whose sampler is timed: the reference backend, with the triton ops for ``triton``.

    For ``torch``, ``group_elements`` None keeps the default backend (``load_backend()``, with its own
    grouping); an int overrides ``SamplerTuning.group_elements`` (0: one pass), for A/B runs of the
    grouped verification.
    """
    if impl == "torch" and group_elements is None:
        from spec_backend.backends import load_backend

        return load_backend()
    from spec_backend.backends.base import SamplerTuning
    from spec_backend.backends.reference import ReferenceBackend
    from spec_backend.sampling.ops import SamplerOps
    from spec_backend.sampling.triton.ops import TritonSamplerOps

    if impl == "torch":
        tuning = SamplerTuning(group_elements=group_elements or None)
    else:
        tuning = SamplerTuning(vocab_block=vocab_block, max_grid=max_grid, device_uniforms=True)

    class TunedReference(ReferenceBackend):
        def sampler_ops(self) -> SamplerOps:
            return TritonSamplerOps(tuning) if impl == "triton" else super().sampler_ops()

        def sampler_tuning(self) -> SamplerTuning:
            return tuning

    return TunedReference()


def make_sampler(mode: str, device: str, backend: Backend | None = None) -> RejectionSampler:
    cfg = {
        "block": RejectionSamplerConfig(enable_block_verify=True),
        "cumulative": RejectionSamplerConfig(enable_block_verify=True, block_verify_mode="cumulative"),
        "entropy": RejectionSamplerConfig(
            enable_entropy_verify=True, posterior_threshold=THETA, posterior_alpha=ALPHA
        ),
    }.get(mode)
    if mode == "synthetic":
        return RejectionSampler(method="synthetic", synthetic_acceptance_rates=RATES, backend=backend)
    return RejectionSampler(cfg, backend=backend)


# --- the naive baseline: one request at a time, plain torch ops, Python loops -----------------------------


def _residual_sample(p: torch.Tensor, q: torch.Tensor | None, b: float, gen: torch.Generator) -> int:
    w = b * p if q is None else torch.clamp(b * p - q, min=0)
    if float(w.sum()) <= 0:
        w = p
    return int(torch.multinomial(w, 1, generator=gen))


def naive_sampler(mode: str) -> Callable[..., torch.Tensor]:
    """A straightforward per-request reference: softmax per request, Python loop over drafts."""

    def run(
        drafts: list[list[int]], q_all: torch.Tensor | None, logits: torch.Tensor, temp: float
    ) -> torch.Tensor:
        gen = torch.Generator(device=logits.device).manual_seed(0)
        max_k = max(len(d) for d in drafts)
        out = torch.full((len(drafts), max_k + 1), -1, dtype=torch.int32)
        row = qrow = 0
        for b, d in enumerate(drafts):
            k = len(d)
            lg = logits[row : row + k + 1]  # [K+1, V]
            q = q_all[qrow : qrow + k] if q_all is not None else None  # [K, V]
            emitted: list[int] = []
            if mode == "greedy" or temp == 0.0:
                best = torch.argmax(lg, dim=-1).tolist()
                for i, x in enumerate(d):
                    if x != best[i]:
                        break
                    emitted.append(x)
                emitted.append(best[len(emitted)])
            else:
                p = torch.softmax(lg / temp, dim=-1)  # [K+1, V]
                u = torch.rand(k + 1, generator=gen, device=lg.device, dtype=torch.float64).tolist()
                rho = [float(p[i, x]) / (float(q[i, x]) if q is not None else 1.0) for i, x in enumerate(d)]
                n, scale = _naive_accept(mode, rho, u, p, q, d, lg)
                emitted = d[:n]
                qn = q[n] if (q is not None and n < k) else None
                if q is None and n < k:
                    qn = torch.zeros_like(p[n])
                    qn[d[n]] = 1.0
                emitted.append(_residual_sample(p[n], None if mode == "synthetic" else qn, scale, gen))
            out[b, : len(emitted)] = torch.tensor(emitted, dtype=torch.int32)
            row += k + 1
            qrow += k
        return out

    return run


def _naive_accept(
    mode: str,
    rho: list[float],
    u: list[float],
    p: torch.Tensor,
    q: torch.Tensor | None,
    d: list[int],
    lg: torch.Tensor,
) -> tuple[int, float]:
    k = len(d)
    if mode == "synthetic":
        return sum(1 for i in range(k) if u[0] < RATES[i]), 1.0
    if mode in ("standard", "entropy"):
        tau = [1.0] * k
        if mode == "entropy":
            logp = torch.log_softmax(lg[:k].double(), dim=-1)
            tau = [min(float(torch.exp(-ALPHA * -(logp[i].exp() * logp[i]).sum())), THETA) for i in range(k)]
        n = 0
        while n < k and u[n] * tau[n] < rho[n]:
            n += 1
        return n, 1.0
    if mode == "cumulative":
        n, lhs, rhs = 0, 1.0, 1.0
        for i in range(k):
            lhs, rhs = lhs * min(1.0, rho[i]), rhs * u[i]
            if rhs < lhs:
                n = i + 1
        return n, 1.0
    weights, n = [1.0], 0  # block (Sun et al. 2024, Alg. 2)
    for i in range(k):
        weights.append(min(1.0, weights[-1] * rho[i]))
    for i in range(1, k + 1):
        if i == k:
            h = weights[k]
        else:
            qi = q[i] if q is not None else torch.nn.functional.one_hot(torch.tensor(d[i]), p.shape[1]).to(p)
            r = float(torch.clamp(weights[i] * p[i] - qi, min=0).sum())
            h = r / (r + 1 - weights[i]) if r + 1 - weights[i] > 0 else 1.0
        if u[i - 1] < h:
            n = i
    return n, weights[n]


# --- inputs and timing -------------------------------------------------------------------------------------


@dataclass
class Inputs:
    drafts: list[list[int]]
    metadata: SpecDecodeMetadata
    logits: torch.Tensor  # [B*(K+1), V]
    probs: torch.Tensor  # [B*K, V]
    random: SamplingMetadata
    greedy: SamplingMetadata


def make_inputs(batch: int, k: int, vocab: int, device: str) -> Inputs:
    gen = torch.Generator(device=device).manual_seed(batch * 1000 + k)
    logits = torch.randn(batch * (k + 1), vocab, generator=gen, device=device) * 2.0
    probs = torch.softmax(torch.randn(batch * k, vocab, generator=gen, device=device) * 2.0, dim=-1)
    draft_ids = torch.argmax(probs, dim=-1).view(batch, k).tolist() if k else [[] for _ in range(batch)]
    seeds = list(range(batch))
    positions = [100] * batch
    return Inputs(
        draft_ids,
        SpecDecodeMetadata.from_draft_tokens(draft_ids, device=device),
        logits,
        probs,
        SamplingMetadata.from_lists([1.0] * batch, seeds=seeds, positions=positions, device=device),
        SamplingMetadata.greedy(batch, device=device),
    )


def timed(fn: Callable[[], object], device: str, budget_s: float) -> tuple[float, float]:
    """(median, min) µs per call: one warm-up call, then repeats until ``budget_s`` is spent.

    3 to 30 repeats after the warm-up. Calls slower than ``SLOW_S`` are timed once (the warm-up call
    itself: first-call effects are negligible at that size), which keeps the CPU grid near 10 minutes.
    The minimum is the better estimate on a machine shared with other jobs.
    """
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    start = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - start
    if first > SLOW_S:
        return first * 1e6, first * 1e6
    samples: list[float] = []
    while len(samples) < 30 and (len(samples) < 3 or sum(samples) < budget_s):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6, min(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="B in {1, 64}, K in {1, 4}, V = 32000 only")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of repeats per measurement")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch default)")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=0.0,
        help="stop starting new shapes after this many seconds (0: none)",
    )
    parser.add_argument("--impl", default="torch", choices=["torch", "triton"], help="sampler ops to time")
    parser.add_argument("--vocab-block", type=int, default=4096, help="triton: SamplerTuning.vocab_block")
    parser.add_argument("--max-grid", type=int, default=None, help="triton: SamplerTuning.max_grid")
    parser.add_argument(
        "--group-elements",
        type=int,
        default=None,
        help="torch: override SamplerTuning.group_elements (0: one pass; default: the backend's own)",
    )
    parser.add_argument("--batches", type=int, nargs="+", help="override the B values")
    parser.add_argument("--ks", type=int, nargs="+", help="override the K values")
    parser.add_argument("--vocabs", type=int, nargs="+", help="override the V values")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batches, ks, vocabs = (
        ([1, 64], [1, 4], [32000]) if args.quick else ([1, 8, 64, 256], [1, 4, 8], [32000, 151936])
    )
    batches, ks, vocabs = args.batches or batches, args.ks or ks, args.vocabs or vocabs
    backend = make_backend(args.impl, args.vocab_block, args.max_grid, args.group_elements)
    samplers = {m: make_sampler(m, args.device, backend) for m in MODES}
    header = ("V", "B", "K", "mode", "µs/call", "min µs", "GB/s", "naive µs/call", "speed-up")
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    else:
        print(FMT.format(*header))
    started = time.perf_counter()
    for vocab in vocabs:
        for batch in batches:
            for k in ks:
                if args.time_limit and time.perf_counter() - started > args.time_limit:
                    print(f"skipped V={vocab} B={batch} K={k}: --time-limit {args.time_limit:.0f} s reached")
                    continue
                for row in bench_shape(samplers, batch, k, vocab, args.device, args.budget):
                    if args.markdown:
                        print("| " + " | ".join(str(c) for c in row) + " |", flush=True)
                    else:
                        print(FMT.format(*row), flush=True)


def bench_shape(
    samplers: dict[str, RejectionSampler], batch: int, k: int, vocab: int, device: str, budget: float
) -> list[tuple[object, ...]]:
    """One table row per mode for one (B, K, V): ours vs the naive baseline on the same inputs."""
    inp = make_inputs(batch, k, vocab, device)
    rows: list[tuple[object, ...]] = []
    for mode in MODES:
        sampling = inp.greedy if mode == "greedy" else inp.random
        probs = None if mode in ("greedy", "synthetic") else inp.probs
        temp = 0.0 if mode == "greedy" else 1.0
        ours, ours_min = timed(
            partial(samplers[mode], inp.metadata, probs, inp.logits, sampling), device, budget
        )
        base, _ = timed(partial(naive_sampler(mode), inp.drafts, probs, inp.logits, temp), device, budget)
        nbytes = inp.logits.numel() * 4 + (probs.numel() * 4 if probs is not None else 0)
        rows.append(
            (
                vocab,
                batch,
                k,
                mode,
                f"{ours:.0f}",
                f"{ours_min:.0f}",
                f"{nbytes / ours / 1e3:.2f}",
                f"{base:.0f}",
                f"{base / ours:.1f}x",
            )
        )
    return rows


if __name__ == "__main__":
    main()
