"""ACLGraph runner: capture ``fn(**inputs)`` per planned size on the NPU, replay with padding.

* Capture: one ``torch.npu.NPUGraph`` per size, largest first, all in one memory pool
  (``torch.npu.graph_pool_handle()``). Inputs live in static buffers allocated once at the largest
  size; the graph of size ``s`` reads the views ``buffer[:s]``. Each size is warmed up eagerly once
  before it is captured.
* Replay: inputs of ``n`` tokens are copied into the buffers, the tail up to the next captured size
  is zeroed, the *update hook* runs, the graph replays and its output is sliced back to ``n`` rows
  (a copy: the static output is overwritten by the next replay). Above the largest size ``fn`` runs
  eagerly.
* FULL-graph attention: attention calls captured inside ``fn`` register themselves
  (:mod:`spec_backend_ascend.graph_params`); before replaying a graph that contains them, the update
  hook must call :meth:`AclGraphRunner.update_attention` with the step's lengths. Replaying stale
  lengths is refused rather than silently computing wrong attention.
* The graph budget (hardware streams, a heuristic shared by every runner of one backend) bounds how many
  graphs are captured; a capture that still runs out of streams (CANN error 207008) raises a
  ``BackendError`` that says how to capture fewer graphs.

Static buffers, padding, slicing, capture order and eager fallback are the backend-neutral
:class:`spec_backend.backends.graph_common.PaddedGraphRunner`; this module supplies the ACLGraph
driver and the update-before-replay step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch

from spec_backend.backends.base import BackendError, GraphFn, GraphOutput
from spec_backend.backends.graph_common import CapturedGraph, PaddedGraphRunner, output_tensors
from spec_backend.graphs import subsample_evenly
from spec_backend_ascend.graph_params import CaptureRecord, capture_scope, update_attention
from spec_backend_ascend.npu import npu_namespace

logger = logging.getLogger(__name__)

#: How CANN reports a capture that ran out of streams: runtime error 207008, "Stream resources are
#: insufficient" (vllm-ascend RFC #9691; vllm_ascend/compilation/acl_graph.py matches the same markers).
STREAM_ERROR_MARKERS = ("207008", "tream resources are insufficient", "insufficient_stream_resources")
STREAM_ERROR_ADVICE = (
    "ACLGraph capture ran out of NPU stream resources (error 207008); the stream budget is a heuristic "
    "(spec_backend_ascend.limits.GRAPH_STREAM_BUDGET). Capture fewer or smaller graphs: pass fewer "
    "capture sizes or a smaller max capture size to plan_capture_sizes, capture fewer drafter graphs, "
    "upgrade HDK/CANN, or run eagerly (enforce_eager=True) to confirm. Device error: {error}"
)

#: hook(size, static_inputs): runs before every replay of the graph captured at ``size``.
UpdateHook = Callable[[int, Mapping[str, torch.Tensor]], None]


class _AclGraph:
    """An ``NPUGraph`` with the attention tasks captured inside it."""

    def __init__(self, graph: Any, record: CaptureRecord) -> None:
        self.graph = graph
        self.record = record

    def replay(self) -> None:
        self.graph.replay()


class AclGraphDriver:
    """``GraphDriver`` on ``torch.npu``: one graph pool, eager warm-up, capture with attention records."""

    def check_device(self) -> None:
        npu_namespace()  # raises BackendError naming the cause when torch_npu / CANN is missing

    def new_pool(self) -> Any:
        return npu_namespace().graph_pool_handle()

    def warm_up(self, call: Callable[[], GraphOutput], iterations: int) -> None:
        for _ in range(iterations):  # lazy initialisation and allocator growth happen eagerly
            call()
        npu_namespace().synchronize()

    def capture(self, call: Callable[[], GraphOutput], pool: Any) -> tuple[CapturedGraph, GraphOutput]:
        """Capture ``call()`` (one tensor or a tuple of them), recording its attention tasks."""
        npu = npu_namespace()
        graph = npu.NPUGraph()
        record = CaptureRecord(size=0)
        try:
            with capture_scope(record), npu.graph(graph, pool=pool):
                output = call()
        except RuntimeError as exc:
            if any(marker in str(exc) for marker in STREAM_ERROR_MARKERS):
                raise BackendError(
                    STREAM_ERROR_ADVICE.format(error=" ".join(str(exc).split())[:300])
                ) from exc
            raise
        first = output_tensors(output)[0]  # TypeError naming the output when it is neither form
        if first.dim() > 0:
            record.size = int(first.shape[0])
        return _AclGraph(graph, record), output

    def synchronize(self) -> None:
        npu_namespace().synchronize()


class AclGraphRunner(PaddedGraphRunner):
    """Graph runner on ``torch.npu.NPUGraph`` with per-replay attention-parameter updates."""

    def __init__(
        self,
        fn: GraphFn,
        capture_sizes: Sequence[int],
        graph_budget: int | None = None,
    ) -> None:
        sizes = sorted(set(capture_sizes))
        if graph_budget is not None and len(sizes) > graph_budget:
            kept = subsample_evenly(sizes, graph_budget)
            logger.warning(
                "ACLGraph stream budget allows %d graphs; capturing sizes %s of the %d requested",
                graph_budget,
                kept,
                len(sizes),
            )
            sizes = kept
        super().__init__(
            fn, sizes, AclGraphDriver(), warmup_iters=1, progress=False, desc="Capturing ACLGraphs"
        )
        self.graph_budget = graph_budget
        self._hook: UpdateHook | None = None
        self._update_stream: Any = None
        self._lengths: tuple[list[int], list[int]] | None = None

    def set_step_lengths(self, query_lens: Sequence[int], kv_lens: Sequence[int]) -> None:
        """Lengths of the next ``run``; re-issued into the captured attention before the replay."""
        self._lengths = (list(query_lens), list(kv_lens))

    def set_update_hook(self, hook: UpdateHook | None) -> None:
        """Register ``hook(size, static_inputs)``, called before every replay (``None`` removes it)."""
        self._hook = hook

    def _record(self, size: int) -> CaptureRecord:
        return cast(_AclGraph, self._graphs[size]).record

    def attention_tasks(self, size: int) -> int:
        """How many attention tasks the graph of ``size`` captured (each is updated before replay)."""
        return len(self._record(size).attentions)

    def update_attention(
        self, size: int, query_lens: Sequence[int] | torch.Tensor, kv_lens: Sequence[int] | torch.Tensor
    ) -> None:
        """Re-issue the attention tasks of graph ``size`` with this step's per-request lengths.

        ``query_lens`` / ``kv_lens`` cover the real requests (host lists preferred: device tensors
        cost a sync); requests added by padding to ``size`` are filled in.
        """
        if self._update_stream is None:
            self._update_stream = npu_namespace().Stream()
        update_attention(self._record(size), query_lens, kv_lens, self._update_stream)

    def before_replay(self, size: int, views: Mapping[str, torch.Tensor]) -> None:
        """Run the update hook; refuse to replay attention tasks whose lengths were not rewritten."""
        npu_namespace().current_stream().synchronize()  # the previous replay must finish first
        record = self._record(size)
        record.fresh = False
        if self._hook is not None:
            self._hook(size, views)
        elif self._lengths is not None:
            self.update_attention(size, *self._lengths)
            self._lengths = None
        if record.attentions and not record.fresh:
            raise RuntimeError(
                f"the graph of size {size} captured {len(record.attentions)} attention task(s) whose "
                "sequence lengths must be updated before every replay: register an update hook that "
                "calls runner.update_attention(size, query_lens, kv_lens)"
            )
