"""Ascend NPU backend for spec-backend (distribution ``spec-backend-ascend``).

Modules: ``limits`` (K+1 <= 16 query tokens per request, head dims per layout, the stream budget
shared by every graph runner), ``backend`` (the probe and
the Backend class), ``attention`` (ragged attention through ``npu_fused_infer_attention_score``),
``graph_runner`` + ``graph_params`` (ACLGraph capture/replay with attention-length updates before
each replay), ``sampler`` (the shared triton sampler kernels with Ascend tuning).

Nothing here imports ``torch_npu`` at module import time: only ``probe()`` tries, and turns any failure
(for example CANN's ``libhccl.so`` missing) into ``unavailable: <reason>``; device parts import it
when first used.
"""

from __future__ import annotations

from spec_backend_ascend.backend import AscendBackend
from spec_backend_ascend.limits import (
    GRAPH_STREAM_BUDGET,
    MAX_CAPTURE_SIZE,
    MAX_QUERY_TOKENS_PER_REQUEST,
    STREAMS_PER_GRAPH,
    StreamLedger,
)

__all__ = [
    "GRAPH_STREAM_BUDGET",
    "MAX_CAPTURE_SIZE",
    "MAX_QUERY_TOKENS_PER_REQUEST",
    "STREAMS_PER_GRAPH",
    "AscendBackend",
    "StreamLedger",
]
