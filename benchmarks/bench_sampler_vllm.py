"""The plugin's verification against vLLM's own, on the same GPU in the same run (issue 43, item 2).

Inside vLLM the plugin replaces exactly one function of ``vllm/v1/sample/rejection_sampler.py``:
``rejection_sample`` (and the small ``expand_batch_to_tokens`` that spreads temperatures over draft
rows). Everything around it (logits processors, temperature / top-k / top-p, the bonus token from vLLM's
``Sampler``) stays vLLM's. So the question "does the plugin make a vLLM user's step slower or faster"
is answered by calling both functions with the same arguments:

* ``vllm``: ``rejection_sample`` of vLLM's file (``--vllm-file``, taken from the vLLM wheel beforehand:
  ``unzip -p vllm-0.33.0-*.whl vllm/v1/sample/rejection_sampler.py``). The file is read at run time and
  executed with its ``vllm.*`` imports answered by stand-ins (``peer_module``): its kernels and the
  functions timed here need only torch and triton; nothing of it enters this project;
* ``ours``: the plugin's ``Verifier`` (``spec_backend/integrations/vllm_sampler.py``) over our
  ``RejectionSampler`` on the CUDA backend, the object the plugin installs.

Inputs as vLLM hands them over: processed float32 target logits ``[B·K, V]``, draft ids, the bonus ids
``[B, 1]``, draft probabilities ``[B·K, V]`` in the ``+q`` mode. Modes: ``greedy`` (all requests
temperature 0), ``standard`` (temperature 1, no draft probabilities: n-gram-like), ``standard+q`` (EAGLE /
draft-model-like). Unseeded requests (vLLM's fastest path: seeded ones loop over per-request generators).
Times are medians of CUDA-event timings, eager (inputs rotate among copies over 256 MiB so the L2 cache
does not serve them) and replayed from a CUDA graph (``/graph``: the device time alone). Checks printed
with the table: greedy outputs of the two are identical token for token; in the random modes the mean
emitted tokens per request agree within a stated noise floor (4 standard errors over ``--law-calls``
calls): both implement the same acceptance law, with different random numbers.

    python benchmarks/bench_sampler_vllm.py --vllm-file .peer/vllm_0.33.0_rejection_sampler.py
    python benchmarks/bench_sampler_vllm.py --vllm-file F --batches 1,8 --ks 1,4 --vocab 4096   # smaller
"""

from __future__ import annotations

import argparse
import ast
import math
import statistics
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a bare checkout
sys.path.insert(0, str(ROOT / "backends" / "cuda"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_sampler_bandwidth import copy_bandwidth, timer  # noqa: E402

MODES = ("greedy", "standard", "standard+q")


class _Absent:
    """Stands in for a ``vllm`` name the timed functions never use; using it is an error."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"bench_sampler_vllm: the peer used {self._name}, which has no stand-in")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")


def _dispatcher(*, warmup_inputs: Any, kernel: Any = None) -> Callable[[Any], Any]:
    """vLLM's ``triton_kernel_dispatcher_with_warmup`` without the warm-up: the decorated function
    returns ``(grid, constexprs)``; its arguments go to the kernel by name (``x`` or ``x_ptr``), those
    the kernel does not take having served the grid."""
    import inspect

    def decorate(dispatch: Any) -> Any:
        params = list(inspect.signature(dispatch).parameters)
        names = set(kernel.arg_names)

        def launch(*args: Any, **kwargs: Any) -> None:
            grid, consts = dispatch(*args, **kwargs)
            bound = dict(zip(params, args, strict=False)) | kwargs
            named = {(n if n in names else n + "_ptr"): v for n, v in bound.items()}
            # arguments the kernel does not take served the grid only (``max_spec_len`` for recovery)
            kernel[grid](**{n: v for n, v in named.items() if n in names}, **consts)

        return launch

    return decorate


def peer_module(path: Path) -> types.ModuleType:
    """Execute vLLM's ``rejection_sampler.py`` with stand-ins for its ``vllm.*`` imports."""
    import logging

    import triton
    import triton.language as tl

    source = path.read_text(encoding="utf-8")
    real = {
        "tl": tl,
        "triton": triton,
        "triton_kernel_dispatcher_with_warmup": _dispatcher,
        "init_logger": logging.getLogger,
    }
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
            module = types.ModuleType(str(node.module))
            for alias in node.names:
                setattr(module, alias.name, real.get(alias.name, _Absent(f"{node.module}.{alias.name}")))
            sys.modules[str(node.module)] = module
    peer = types.ModuleType("vllm_peer_rejection_sampler")
    peer.__file__ = str(path)
    sys.modules[peer.__name__] = peer  # triton reads the kernels' globals through their module
    exec(compile(source, str(path), "exec"), peer.__dict__)  # the peer's file, read at run time
    return peer


@dataclass
class Case:
    """One (B, K, mode): the arguments of ``rejection_sample`` with rotating copies of the logits."""

    batch: int
    k: int
    mode: str
    logits: list[torch.Tensor]  # each [B·K, V], processed (vLLM divided by the temperature already)
    draft_probs: torch.Tensor | None  # [B·K, V]
    draft_ids: torch.Tensor  # [B·K] int32
    cu: torch.Tensor  # [B] int32, cumulative draft counts
    bonus: torch.Tensor  # [B, 1] int64
    sampling: Any  # vLLM's SamplingMetadata fields the functions read
    turn: int = 0

    def args(self, rotate: bool = True) -> tuple[Any, ...]:
        self.turn += int(rotate)
        logits = self.logits[self.turn % len(self.logits)] if rotate else self.logits[0]
        nums = [self.k] * self.batch
        return (self.draft_ids, nums, self.k, self.cu, self.draft_probs, logits, self.bonus, self.sampling)


def make_case(batch: int, k: int, mode: str, vocab: int, rotate_bytes: int, device: str) -> Case:
    """Random inputs for one case; drafts are drawn from the target so that some are accepted."""
    gen = torch.Generator(device=device).manual_seed(batch * 1000 + k * 10 + MODES.index(mode))
    rows = batch * k
    copies = max(1, min(32, -(-rotate_bytes // (rows * vocab * 4))))
    logits = [torch.randn(rows, vocab, device=device, generator=gen) * 3 for _ in range(copies)]
    target = torch.softmax(logits[0], dim=-1)  # [B·K, V]
    draft_ids = torch.multinomial(target, 1, generator=gen).squeeze(1).to(torch.int32)  # [B·K]
    greedy = mode == "greedy"
    q = None
    if mode == "standard+q":
        q = torch.softmax(torch.randn(rows, vocab, device=device, generator=gen) * 3, dim=-1)
        draft_ids = torch.multinomial(q, 1, generator=gen).squeeze(1).to(torch.int32)
    sampling = types.SimpleNamespace(
        all_greedy=greedy,
        all_random=not greedy,
        temperature=torch.full((batch,), 0.0 if greedy else 1.0, device=device),
        top_k=None,
        top_p=None,
        generators={},
    )
    cu = torch.arange(1, batch + 1, device=device, dtype=torch.int32) * k
    bonus = torch.randint(0, vocab, (batch, 1), device=device, generator=gen)
    return Case(batch, k, mode, logits, q, draft_ids, cu, bonus, sampling)


def ours() -> Callable[..., torch.Tensor]:
    """The object the plugin installs: a ``Verifier`` over our sampler on the CUDA backend."""
    from spec_backend_cuda import CudaBackend

    from spec_backend.config.rejection import RejectionSamplerConfig
    from spec_backend.integrations.vllm_sampler import Verifier
    from spec_backend.sampling import RejectionSampler

    return Verifier(RejectionSampler(RejectionSamplerConfig(), method="standard", backend=CudaBackend()))


def emitted(out: torch.Tensor) -> float:
    """Mean tokens emitted per request (accepted drafts + 1) in ``[B, K+1]`` output, -1 padded."""
    return float((out != -1).sum(dim=1).double().mean())


def law_check(case: Case, impls: dict[str, Callable[..., torch.Tensor]], calls: int) -> str:
    """Mean emitted tokens per request over ``calls`` calls: equal within 4 standard errors (random
    modes), or identical outputs (greedy)."""
    if case.mode == "greedy":
        outs = {n: f(*case.args(rotate=False)) for n, f in impls.items()}
        same = torch.equal(outs["vllm"].to(torch.int64), outs["ours"].to(torch.int64))
        return "greedy identical" if same else "GREEDY OUTPUTS DIFFER"
    means: dict[str, list[float]] = {}
    for name, fn in impls.items():
        means[name] = [emitted(fn(*case.args(rotate=False))) for _ in range(calls)]
    m = {n: statistics.fmean(v) for n, v in means.items()}
    se = math.sqrt(sum(statistics.variance(v) / len(v) for v in means.values())) or 1e-9
    z = abs(m["vllm"] - m["ours"]) / se
    verdict = "agree" if z < 4 else "DISAGREE"
    return f"emitted/request vllm {m['vllm']:.3f} ours {m['ours']:.3f} (|z| {z:.1f}: {verdict})"


def time_case(
    case: Case,
    impls: dict[str, Callable[..., torch.Tensor]],
    measure: Callable[[Callable[[], object]], float],
    graphs: Any,
) -> dict[str, float]:
    """Median seconds per call, eager and replayed."""
    seconds: dict[str, float] = {}
    for name, fn in impls.items():
        seconds[name] = measure(lambda f=fn: f(*case.args()))
        try:
            graph, _ = graphs.capture_once(lambda f=fn: f(*case.args(rotate=False)))
        except Exception as exc:  # report and go on: the eager column stands
            print(f"  {name} {case.mode}: graph capture failed: {type(exc).__name__}: {exc}"[:200])
            continue
        seconds[name + "/graph"] = measure(graph.replay)
    return seconds


def expand_times(
    peer: types.ModuleType, measure: Callable[[Callable[[], object]], float], batch: int, k: int, device: str
) -> tuple[float, float]:
    """µs of vLLM's ``expand_batch_to_tokens`` and the plugin's ``expand_to_tokens`` (temperatures)."""
    from spec_backend.integrations.vllm_sampler import expand_to_tokens

    temp = torch.rand(batch, device=device)
    cu = torch.arange(1, batch + 1, device=device, dtype=torch.int32) * k
    theirs = measure(lambda: peer.expand_batch_to_tokens(temp, cu, batch * k, 0, 1))
    mine = measure(lambda: expand_to_tokens(temp, cu, batch * k, 0, 1))
    if not torch.equal(
        peer.expand_batch_to_tokens(temp, cu, batch * k, 0, 1), expand_to_tokens(temp, cu, batch * k, 0, 1)
    ):
        print(f"  expand B={batch} K={k}: OUTPUTS DIFFER")
    return theirs * 1e6, mine * 1e6


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm-file", type=Path, required=True, help="vLLM's rejection_sampler.py")
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--ks", default="1,4,8")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--law-calls", type=int, default=40, help="calls per side for the law check")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: vLLM's kernels and ours are timed on one")
    if not args.vllm_file.is_file():
        parser.error(f"--vllm-file {args.vllm_file} does not exist")
    modes = args.modes.split(",")
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes {unknown}; allowed: {list(MODES)}")
    from spec_backend_cuda.graph_runner import CudaGraphDriver

    device, graphs = "cuda", CudaGraphDriver()
    peer = peer_module(args.vllm_file)
    impls: dict[str, Callable[..., torch.Tensor]] = {"vllm": peer.rejection_sample, "ours": ours()}
    measure = timer(device, 5, args.iters)
    bandwidth = copy_bandwidth(device, measure, 1 << 30)
    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, peer {args.vllm_file.name}, "
        f"copy bandwidth {bandwidth / 1e9:.0f} GB/s, V={args.vocab}"
    )
    cols = ["vllm", "ours", "vllm/graph", "ours/graph"]
    print(
        f"{'B':>4} {'K':>2} {'mode':<11}"
        + "".join(f" {c + ' µs':>15}" for c in cols)
        + f" {'eager ratio':>11} {'graph ratio':>11}  check",
        flush=True,
    )
    for batch in [int(b) for b in args.batches.split(",") if b]:
        for k in [int(v) for v in args.ks.split(",") if v]:
            for mode in modes:
                case = make_case(batch, k, mode, args.vocab, 1 << 28, device)
                seconds = time_case(case, impls, measure, graphs)
                check = law_check(case, impls, args.law_calls)
                us = [seconds.get(c) for c in cols]
                row = f"{batch:>4} {k:>2} {mode:<11}" + "".join(
                    f" {t * 1e6:>15.1f}" if t else f" {'-':>15}" for t in us
                )
                ratios = [
                    f"{seconds[a] / seconds[b]:.2f}x" if a in seconds and b in seconds else "-"
                    for a, b in (("vllm", "ours"), ("vllm/graph", "ours/graph"))
                ]
                print(row + f" {ratios[0]:>11} {ratios[1]:>11}  {check}", flush=True)
                del case
            theirs, mine = expand_times(peer, measure, batch, k, device)
            print(f"{batch:>4} {k:>2} expand      vllm {theirs:.1f} µs, ours {mine:.1f} µs", flush=True)
    print("ratio = vLLM's time / ours: above 1 the plugin makes the step faster by the difference")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
