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
* The graph budget (hardware streams) bounds how many graphs are captured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from spec_backend.backends.base import GraphRunner
from spec_backend.graphs import padded_size, subsample_evenly
from spec_backend_ascend.graph_params import CaptureRecord, capture_scope, update_attention
from spec_backend_ascend.npu import npu_namespace

logger = logging.getLogger(__name__)

#: hook(size, static_inputs): runs before every replay of the graph captured at ``size``.
UpdateHook = Callable[[int, Mapping[str, torch.Tensor]], None]


class AclGraphRunner(GraphRunner):
    """Graph runner on ``torch.npu.NPUGraph`` with per-replay attention-parameter updates."""

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        capture_sizes: Sequence[int],
        graph_budget: int | None = None,
    ) -> None:
        super().__init__(fn, capture_sizes)
        if graph_budget is not None and len(self.capture_sizes) > graph_budget:
            kept = subsample_evenly(list(self.capture_sizes), graph_budget)
            logger.warning(
                "ACLGraph stream budget allows %d graphs; capturing sizes %s of the %d requested",
                graph_budget,
                kept,
                len(self.capture_sizes),
            )
            self.capture_sizes = tuple(kept)
        self.graph_budget = graph_budget
        self._graphs: dict[int, Any] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._records: dict[int, CaptureRecord] = {}
        self._buffers: dict[str, torch.Tensor] = {}
        self._pool: Any = None
        self._hook: UpdateHook | None = None
        self._update_stream: Any = None

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        """Sizes that have a captured graph (ascending)."""
        return tuple(sorted(self._graphs))

    def set_update_hook(self, hook: UpdateHook | None) -> None:
        """Register ``hook(size, static_inputs)``, called before every replay (``None`` removes it)."""
        self._hook = hook

    def attention_tasks(self, size: int) -> int:
        """How many attention tasks the graph of ``size`` captured (each is updated before replay)."""
        return len(self._records[size].attentions)

    def update_attention(
        self, size: int, query_lens: Sequence[int] | torch.Tensor, kv_lens: Sequence[int] | torch.Tensor
    ) -> None:
        """Re-issue the attention tasks of graph ``size`` with this step's per-request lengths.

        ``query_lens`` / ``kv_lens`` cover the real requests (host lists preferred: device tensors
        cost a sync); requests added by padding to ``size`` are filled in.
        """
        if self._update_stream is None:
            self._update_stream = npu_namespace().Stream()
        update_attention(self._records[size], query_lens, kv_lens, self._update_stream)

    def capture(self, example_inputs: Mapping[str, torch.Tensor]) -> None:
        """Capture one graph per size (largest first) over static buffers cloned from the example."""
        largest = self.capture_sizes[-1]
        for name, tensor in example_inputs.items():
            if tensor.shape[0] < largest:
                raise ValueError(f"example input {name!r} has {tensor.shape[0]} rows, need {largest}")
            self._buffers[name] = tensor[:largest].clone()
        npu = npu_namespace()
        self._pool = npu.graph_pool_handle()
        for size in reversed(self.capture_sizes):
            views = self._views(size)
            self.fn(**views)  # warm-up: lazy initialisation and allocator growth happen eagerly
            npu.synchronize()
            graph = npu.NPUGraph()
            record = CaptureRecord(size)
            with capture_scope(record), npu.graph(graph, pool=self._pool):
                output = self.fn(**views)
            if not isinstance(output, torch.Tensor):
                raise TypeError(f"captured callables must return one tensor, got {type(output).__name__}")
            self._graphs[size], self._outputs[size], self._records[size] = graph, output, record
        npu.synchronize()

    def run(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Replay the smallest captured graph that fits; eager above the largest."""
        num_tokens = self._num_tokens(inputs)
        size = padded_size(num_tokens, self._graphs)
        if size is None:
            return self.fn(**inputs)
        views = self._views(size)
        for name, buffer in views.items():
            buffer[:num_tokens].copy_(inputs[name])
            buffer[num_tokens:].zero_()
        npu = npu_namespace()
        npu.current_stream().synchronize()  # the previous replay must finish before tasks are rewritten
        record = self._records[size]
        record.fresh = False
        if self._hook is not None:
            self._hook(size, views)
        if record.attentions and not record.fresh:
            raise RuntimeError(
                f"the graph of size {size} captured {len(record.attentions)} attention task(s) whose "
                "sequence lengths must be updated before every replay: register an update hook that "
                "calls runner.update_attention(size, query_lens, kv_lens)"
            )
        self._graphs[size].replay()
        return self._outputs[size][:num_tokens].clone()

    def _views(self, size: int) -> dict[str, torch.Tensor]:
        return {name: buffer[:size] for name, buffer in self._buffers.items()}

    def _num_tokens(self, inputs: Mapping[str, torch.Tensor]) -> int:
        counts = {t.shape[0] for t in inputs.values()}
        if len(counts) != 1:
            raise ValueError(f"all inputs must share their leading (token) dimension, got {sorted(counts)}")
        if self._buffers and set(inputs) != set(self._buffers):
            raise ValueError(
                f"inputs {sorted(inputs)} differ from the captured inputs {sorted(self._buffers)}"
            )
        return counts.pop()
