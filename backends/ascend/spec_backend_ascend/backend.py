"""The Ascend backend class: probe, limits, capture policy, and the device parts (loaded lazily)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from spec_backend.backends.attention import attention_needs
from spec_backend.backends.base import (
    AttentionFn,
    Availability,
    Backend,
    BackendError,
    CapturePolicy,
    GraphFn,
    GraphRunner,
    ModelOptions,
    SamplerTuning,
    TokenLimits,
)
from spec_backend_ascend.limits import MAX_CAPTURE_SIZE, MAX_QUERY_TOKENS_PER_REQUEST, StreamLedger

if TYPE_CHECKING:
    from spec_backend.sampling.ops import SamplerOps

#: Vector cores on Atlas A2/A3 (Ascend 910B/910C) devices: the sampler kernels' grid cap.
#: Source: the Atlas A2/A3 product specifications (40 AIV cores); triton-ascend runs one program per core.
VECTOR_CORES = 40
#: What the fused attention op cannot compute, by ``attention_needs`` name (its documented arguments have
#: no sink logits and no soft cap, and key and value must have the same shape).
FIA_LACKS = {
    "latent": "values of another head dim than the keys (multi-head latent attention)",
    "sinks": "attention sinks",
    "softcap": "logit soft cap",
}


class AscendBackend(Backend):
    """Huawei Ascend NPUs through torch_npu: fused attention, ACLGraph, triton-ascend sampler kernels."""

    name = "ascend"
    device_type = "npu"
    captures_token_trees = False  # the explicit-mask call is not re-issued by the ACLGraph updates
    # triton-ascend's sampler kernels inside an ACLGraph are not shown to work on a device yet: the
    # sampler runs eagerly after the replayed forward
    captures_sampler = False
    launches_async = True  # operators and ACLGraph replays queue on a stream

    def __init__(self) -> None:
        #: streams of every graph this backend's runners capture (target and drafter): a heuristic budget
        self.streams = StreamLedger()

    def probe(self) -> Availability:
        if importlib.util.find_spec("torch_npu") is None:
            return Availability(
                False, "torch_npu is not installed (needs CANN; pip install spec-backend-ascend[npu])"
            )
        try:
            importlib.import_module("torch_npu")
        except BaseException as exc:  # e.g. OSError: libhccl.so missing; report, never raise
            return Availability(False, f"torch_npu failed to import: {type(exc).__name__}: {exc}")
        npu = getattr(torch, "npu", None)
        try:
            visible = npu is not None and bool(npu.is_available())
        except Exception as exc:  # a probe reports, it never raises
            return Availability(False, f"torch.npu.is_available() failed: {type(exc).__name__}: {exc}")
        if not visible:
            return Availability(False, "torch_npu imported but no NPU device is visible")
        return Availability(True)

    def token_limits(self) -> TokenLimits:
        return TokenLimits(max_query_tokens_per_request=MAX_QUERY_TOKENS_PER_REQUEST)

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        """Whole-forward graphs: the budget is the streams left to this backend's runners (a heuristic),
        whatever the model's depth (``num_hidden_layers`` is part of the contract, unused here)."""
        del num_hidden_layers
        return CapturePolicy(max_capture_size=MAX_CAPTURE_SIZE, graph_budget=self.streams.graphs_left)

    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        """An :class:`AclGraphRunner` within the streams left by this backend's earlier runners (the
        target's and every drafter's); its sizes are reserved from the shared budget (the stream
        ledger). Whole-forward graphs cost the same whatever the model's depth, so no layer count is
        needed here; ``plan_capture_sizes`` applies the same budget when it plans the sizes."""
        from spec_backend_ascend.graph_runner import AclGraphRunner

        runner = AclGraphRunner(fn, capture_sizes, graph_budget=self.capture_policy().graph_budget)
        self.streams.reserve(len(runner.capture_sizes))
        return runner

    def prepare_model(self, model: torch.nn.Module, options: ModelOptions) -> None:
        """Refuse, before any forward, a model whose attention the fused op cannot compute (sliding
        windows it can: its band mode)."""
        del options
        missing = sorted(attention_needs(model) & set(FIA_LACKS))
        if missing:
            kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
            raise BackendError(
                f"backend 'ascend' cannot run this {kind} model: npu_fused_infer_attention_score has no "
                f"{' and no '.join(FIA_LACKS[m] for m in missing)}; use backend 'reference', 'cpu' or 'cuda'"
            )

    def attention_function(self) -> AttentionFn:
        from spec_backend_ascend.attention import ascend_ragged_attention

        return ascend_ragged_attention

    def sampler_ops(self) -> SamplerOps:
        from spec_backend_ascend.sampler import ascend_sampler_ops

        return ascend_sampler_ops(self.sampler_tuning())

    def sampler_tuning(self) -> SamplerTuning:
        # Grid capped at the vector-core count; no float64 random on the device: uniforms are passed in.
        return SamplerTuning(vocab_block=2048, max_grid=VECTOR_CORES, device_uniforms=False)
