"""The CUDA backend class: probe, limits, capture policy, and the device parts (imported lazily)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from spec_backend.backends.base import (
    AttentionFn,
    Availability,
    Backend,
    CapturePolicy,
    GraphFn,
    GraphRunner,
    ModelOptions,
    SamplerTuning,
    TokenLimits,
)
from spec_backend_cuda.limits import VOCAB_BLOCK, memory_capped_capture_size

if TYPE_CHECKING:
    from spec_backend.sampling.ops import SamplerOps

#: Attention paths ``CudaBackend(attention=...)`` accepts (see ``spec_backend_cuda.attention``).
ATTENTION_CHOICES = ("auto", "flash", "sdpa", "triton")


def _flash_note() -> str:
    """A note for the probe when flash-attn cannot run on device 0 (its attention then runs SDPA)."""
    from spec_backend_cuda.attention import device_capability, flash_capability_reason

    reason = flash_capability_reason(device_capability(0))
    return "" if reason is None else f"attention runs on SDPA: {reason}"


class CudaBackend(Backend):
    """NVIDIA GPUs through CUDA: flash-attn/SDPA attention, CUDA graphs, triton sampler kernels.

    ``attention``: ``"auto"`` (flash-attn where it can run the tensors, else SDPA), ``"flash"`` or
    ``"sdpa"`` (force one path), or ``"triton"`` (a kernel reading only each request's valid keys;
    token trees on SDPA). ``fused_kernels``: Llama-family RMSNorms and gated MLPs with fewer kernels
    (``spec_backend_cuda.fused_norm``, ``fused_mlp``; off until a GPU run measures it). ``enforce_eager``:
    :meth:`graph_runner` returns an eager runner (no CUDA graphs), like vLLM's ``enforce_eager``.
    ``graph_warmup_iters``, ``graph_copy_output`` and ``graph_progress`` configure every
    ``CudaGraphRunner`` this backend makes (see
    :class:`~spec_backend.backends.graph_common.PaddedGraphRunner`); they are instance attributes, so
    ``graph_runner`` keeps the contract's ``(fn, capture_sizes)`` signature.
    """

    name = "cuda"
    device_type = "cuda"
    launches_async = True  # kernels and graph replays queue on a stream
    captures_draft_chains = True  # captured attention reads lengths from device tensors
    reads_early = True  # start_host_copy: pinned memory and an event

    def __init__(
        self,
        attention: str = "auto",
        enforce_eager: bool = False,
        graph_warmup_iters: int = 2,
        graph_copy_output: bool = True,
        graph_progress: bool = True,
        fused_kernels: bool = False,
    ) -> None:
        if not isinstance(fused_kernels, bool):
            raise ValueError(f"fused_kernels must be a bool, got {fused_kernels!r}")
        if attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {list(ATTENTION_CHOICES)}, got {attention!r}")
        if isinstance(graph_warmup_iters, bool) or not isinstance(graph_warmup_iters, int):
            raise ValueError(f"graph_warmup_iters must be an integer >= 0, got {graph_warmup_iters!r}")
        if graph_warmup_iters < 0:
            raise ValueError(f"graph_warmup_iters must be an integer >= 0, got {graph_warmup_iters!r}")
        self.attention = attention
        self.enforce_eager = enforce_eager
        self.graph_warmup_iters = graph_warmup_iters
        self.graph_copy_output = graph_copy_output
        self.graph_progress = graph_progress
        self.fused_kernels = fused_kernels

    def start_host_copy(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        """A non-blocking copy into pinned memory, queued now, and an event after it: the wait is for
        the step that wrote ``tensor``, not for the step launched after it."""
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record()

        def wait() -> torch.Tensor:
            done.synchronize()
            return host

        return wait

    def probe(self) -> Availability:
        try:
            if importlib.util.find_spec("triton") is None:
                return Availability(False, "triton is not installed (pip install spec-backend-cuda)")
            if not torch.cuda.is_available():
                built = torch.version.cuda
                why = "torch was built without CUDA" if built is None else "no CUDA device is visible"
                return Availability(False, f"{why} (torch {torch.__version__})")
            old_gpu = _flash_note()
        except Exception as exc:  # a probe reports, it never raises
            return Availability(False, f"CUDA probe failed: {type(exc).__name__}: {exc}")
        return Availability(True, old_gpu)

    def token_limits(self) -> TokenLimits:
        return TokenLimits(max_query_tokens_per_request=None)

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        """Largest capture size capped by free device memory (see ``spec_backend_cuda.limits``)."""
        free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
        return CapturePolicy(max_capture_size=memory_capped_capture_size(free), graph_budget=None)

    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        """A :class:`~spec_backend_cuda.graph_runner.CudaGraphRunner` with this backend's graph options,
        or the reference ``EagerGraphRunner`` when ``self.enforce_eager``."""
        if self.enforce_eager:
            from spec_backend.backends.reference import EagerGraphRunner

            return EagerGraphRunner(fn, capture_sizes)
        from spec_backend_cuda.graph_runner import CudaGraphRunner

        return CudaGraphRunner(
            fn,
            capture_sizes,
            warmup_iters=self.graph_warmup_iters,
            copy_output=self.graph_copy_output,
            progress=self.graph_progress,
        )

    def prepare_model(self, model: torch.nn.Module, options: ModelOptions) -> None:
        """With ``fused_kernels``: Llama-family RMSNorms as one triton kernel each
        (``spec_backend_cuda.fused_norm``) and gated MLPs with merged gate/up projections and one gating
        kernel (``spec_backend_cuda.fused_mlp``), target and draft models alike."""
        del options
        if self.fused_kernels:
            from spec_backend_cuda.fused_mlp import install_fused_mlps
            from spec_backend_cuda.fused_norm import install_fused_norms

            install_fused_norms(model)
            install_fused_mlps(model)

    def attention_function(self) -> AttentionFn:
        from spec_backend_cuda.attention import ATTENTION_PATHS

        return ATTENTION_PATHS[self.attention]

    def sampler_ops(self) -> SamplerOps:
        """The shared triton kernels with the CUDA tuning (``TritonSamplerOps(self.sampler_tuning())``)."""
        from spec_backend.sampling.triton.ops import TritonSamplerOps

        ops: SamplerOps = TritonSamplerOps(self.sampler_tuning())
        return ops

    def sampler_tuning(self) -> SamplerTuning:
        # No grid cap (CUDA launches any grid); float64 uniforms drawn in-kernel. Measured on an H200
        # (docs/benchmarks.md, "CUDA (H200), second round"): rows shared by up to 32 programs took 158 us
        # against 520 us with one program per row (composed standard verification, graph-replayed,
        # V=151936, B=1, K=4) and 401 against 725 us at B=64, K=4; 8 splits were within 5 % of 32. The
        # fused point-mass path is faster with 1024-wide tiles at every measured B and K (149 against
        # 188 us at B=64, K=4); the composed +q modes keep 4096 (block+q: 558 against 776 us).
        return SamplerTuning(
            vocab_block=VOCAB_BLOCK,
            max_grid=None,
            device_uniforms=True,
            vocab_splits=32,
            fused_block=1024,
        )
