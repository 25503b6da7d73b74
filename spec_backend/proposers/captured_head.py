"""An EAGLE-style head's one-token draft steps (drafts 2..K of a chain) replayed from captured graphs.

A chain head (``models/chain_head.py``: EAGLE-1, EAGLE-3, MTP) first feeds each request's committed rows
(ragged: eager), then one row per request for each further draft: the draft just drawn and the head's
output for the row before it. That step has one shape per batch size, so it is captured as a draft
model's one-token decode step is (``runtime/captured.py``): at 1, 2, 4, … requests up to the head
cache's slots, padding requests on the free slots after the live ones (position 0: a free slot's rows
are rewritten when a request takes it), the attention mask from the device ``seq_lens``, keys read over
each slot's whole capacity (zeroed at capture). Drawing each draft from the head's logits stays eager
between replays. A head whose draft index picks its weights (MTP with several layers,
``ChainHead.step_kinds``) runs eagerly: a draft step feeds its layer every chain row that layer has not
computed (``layered_chain``), a row count that varies with the step, not one row per request.

Where the backend's captured attention reads each forward's lengths from device tensors
(``Backend.captures_draft_chains``) and drafts are point masses (argmax), the whole chain after draft 1 is
one more graph set: K-1 forwards and argmaxes over lengths growing on the device, one replay for drafts
2..K (a step drafting fewer, adaptive drafting's choice, replays the one-row graphs). On a GPU an eager
draft step launches every kernel of the head from the host (tens of launches, each a few microseconds),
K-1 times a step.

Glossary: *chain* — the drafts one replay of the chain graph draws (K-1; 0: no chain graph); *covers* —
a batch replays only from slot 0 over every live slot (padding requests take the slots after it, which
must be free) and within the largest capture size (above it the callable would attend over whole
slots eagerly: the ordinary eager step is faster).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from spec_backend.graphs import padded_size, plan_capture_sizes
from spec_backend.runtime.captured import (
    capture_allowed,
    captured_or_refused,
    covers_live,
    replay_chain,
    replay_planned,
)
from spec_backend.runtime.static_batch import host_plan, static_step_batch
from spec_backend.step import StepBatch

if TYPE_CHECKING:
    from spec_backend.backends.base import Backend, GraphRunner
    from spec_backend.models.chain_head import ChainHead
    from spec_backend.runtime.kv_cache import RaggedKVCache

logger = logging.getLogger("spec_backend.engine")


class CapturedHeadStep:
    """``head``'s one-token forwards over ``cache`` replayed from graphs (module docstring)."""

    def __init__(
        self, head: ChainHead, cache: RaggedKVCache, backend: Backend, max_num_seqs: int, chain: int = 0
    ) -> None:
        self.head, self.cache, self.chain = head, cache, chain
        # batch size -> the host plan of a replay ahead: committed rows (K+1 a request), the chain (K-1)
        self._committed_plans: dict[int, StepBatch] = {}
        self._chain_plans: dict[int, StepBatch] = {}
        self.capture_sizes = plan_capture_sizes(0, max_num_seqs, backend=backend)
        param = next(head.parameters())
        largest, width = self.capture_sizes[-1], int(head.config.hidden_size)
        example = {
            "input_ids": torch.zeros(largest, dtype=torch.int64, device=param.device),  # [N]
            "hidden": torch.zeros(largest, width, dtype=param.dtype, device=param.device),  # [N, H]
            "seq_lens": torch.ones(largest, dtype=torch.int64, device=param.device),  # [N]
        }
        self.graph: GraphRunner = backend.graph_runner(self._forward, self.capture_sizes)
        self.graph.capture(example)
        self.chain_graph: GraphRunner | None = None
        #: a step's committed rows at K+1 rows per request over device lengths (drafting ahead:
        #: ``eagle_ahead``); captured with the chain where the backend's attention reads device lengths
        self.committed_graph: GraphRunner | None = None
        self.rows = chain + 2  # K+1
        if chain:
            self.chain_graph = backend.graph_runner(self._chain, self.capture_sizes)
            self.chain_graph.capture(example)
        self.committed_sizes: list[int] = []
        # planned as the verify step's sizes (K+1 rows per request; the backend's cap now, which on CUDA
        # follows free memory, so the verify step's, planned later, may be smaller: speed only)
        if chain and backend.captures_draft_chains:
            self.committed_sizes = plan_capture_sizes(self.rows - 1, max_num_seqs, backend=backend)
            self.committed_graph = backend.graph_runner(self._committed, self.committed_sizes)
            largest_rows = self.committed_sizes[-1]
            self.committed_graph.capture(
                {name: t[:1].expand(largest_rows, *t.shape[1:]).contiguous() for name, t in example.items()}
            )
        cache.zero_all()  # the example rows the captures wrote
        logger.info(
            "captured the draft head's one-row step for %s requests%s",
            self.capture_sizes,
            f", and its greedy chain of {chain} draft(s)" if chain else "",
        )

    def covers(self, start: int, batch_size: int) -> bool:
        """Whether a step of ``batch_size`` requests from slot ``start`` replays (glossary: *covers*)."""
        return covers_live(start, batch_size, self.cache, self.capture_sizes)

    def _forward(
        self,
        input_ids: torch.Tensor,  # [N] each request's draft just drawn
        hidden: torch.Tensor,  # [N, H] the head's output for the row before it
        seq_lens: torch.Tensor,  # [N] each request's rows with this one (padding: 0)
    ) -> torch.Tensor:  # [N, H]
        """The captured callable: one row per request, every shape static."""
        return self._rows(input_ids, hidden, seq_lens, 1)  # padding: position 0

    def _rows(
        self,
        input_ids: torch.Tensor,  # [B * q]
        hidden: torch.Tensor,  # [B * q, H]
        seq_lens: torch.Tensor,  # [B] each request's rows with its q rows (padding: 0)
        q: int,
    ) -> torch.Tensor:  # [B * q, H]
        """``q`` rows per request of the head over its cache, every shape static (the captured callables'
        body)."""
        n = input_ids.shape[0]
        b = n // q
        batch = static_step_batch(input_ids, seq_lens, q, self.cache.capacity)
        self.cache.plan = batch
        try:
            ids, positions = input_ids.view(b, q), batch.positions.view(b, q)
            out: torch.Tensor = self.head(ids, hidden.view(b, q, -1), positions, self.cache, batch.attention)
        finally:
            self.cache.plan = None
        return out.reshape(n, -1)

    def _chain(
        self,
        input_ids: torch.Tensor,  # [N] draft 1
        hidden: torch.Tensor,  # [N, H] the head's output for the row before it
        seq_lens: torch.Tensor,  # [N] each request's rows with draft 1's (padding: 0)
    ) -> torch.Tensor:  # [N, chain] int64 drafts 2..K
        """The chain's captured callable: each draft fed back, its successor the argmax of the head's
        logits (``EagleDrafter._draw`` without probabilities), as the one-row steps and eager draws do."""
        ids, out, drafts = input_ids, hidden, []
        for step in range(1, self.chain + 1):
            out = self._forward(ids, out, seq_lens + (step - 1))  # [N, H]
            ids = self.head.argmax_draft(out, step)  # [N]
            drafts.append(ids)
        return torch.stack(drafts, dim=1)

    def _committed(
        self,
        input_ids: torch.Tensor,  # [N * q] each row's next token
        hidden: torch.Tensor,  # [N * q, H] each row's target features through ``combine``
        seq_lens: torch.Tensor,  # [N * q] each request's rows with its q rows, repeated per row
    ) -> torch.Tensor:  # [N * q, H]
        """The committed rows' captured callable: ``q`` rows per request (``rows``), every shape static."""
        q = self.rows
        return self._rows(input_ids, hidden, seq_lens.view(-1, q)[:, 0], q)

    @torch.no_grad()
    def committed_ahead(
        self,
        input_ids: torch.Tensor,  # [B, q] each row's next token
        hidden: torch.Tensor,  # [B, q, H]
        seq_lens: torch.Tensor,  # [B] each request's rows with these, on the device only
    ) -> torch.Tensor:  # [B, q, H]
        """``q`` rows per request of every live slot over lengths the host has not read (drafting ahead):
        the host reserves them past its lengths (an upper bound), over a plan made once per batch size."""
        if self.committed_graph is None:
            raise ValueError(
                "this head's steps were captured without device lengths: it does not draft ahead"
            )
        b, q = input_ids.shape
        plan = host_plan(self._committed_plans, b, q, self.cache.capacity, input_ids.device)
        inputs = {
            "input_ids": input_ids.reshape(b * q),
            "hidden": hidden.reshape(b * q, -1),
            "seq_lens": seq_lens.repeat_interleave(q),
        }
        return replay_planned(self.committed_graph, self.cache, plan, inputs).view(b, q, -1)

    @torch.no_grad()
    def chain_ahead(self, first: torch.Tensor, hidden: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Drafts 2..K after draft 1 ``first [B]`` and the head output ``hidden [B, H]`` that drew it, each
        request's rows with draft 1's ``seq_lens [B]`` on the device only: ``[B, chain]``."""
        if self.chain_graph is None:
            raise ValueError("this head's draft steps were captured without a chain graph")
        plan = host_plan(self._chain_plans, first.shape[0], self.chain, self.cache.capacity, first.device)
        inputs = {"input_ids": first, "hidden": hidden, "seq_lens": seq_lens}
        return replay_planned(self.chain_graph, self.cache, plan, inputs)

    def goes_ahead(self, batch_size: int) -> bool:
        """Whether drafting ahead replays for every live slot of ``batch_size`` requests: the committed
        rows' graph holds their K+1 rows each, and the chain covers them."""
        fits = padded_size(batch_size * self.rows, self.committed_sizes) is not None
        return self.committed_graph is not None and fits and self.covers(0, batch_size)

    def chains(self, start: int, batch_size: int, drafts: int) -> bool:
        """Whether a step drafting ``drafts`` for ``batch_size`` requests from slot ``start`` replays the
        chain graph after draft 1."""
        return self.chain_graph is not None and drafts == self.chain + 1 and self.covers(start, batch_size)

    @torch.no_grad()
    def forward_chain(self, first: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Drafts 2..K of every live request (``chains``) after draft 1 ``first [B]`` and the head's output
        ``hidden [B, H]`` for the row before it: one replay (``replay_chain``)."""
        if self.chain_graph is None:
            raise ValueError("this head's draft steps were captured without a chain graph")
        return replay_chain(self.chain_graph, self.cache, self.chain, {"input_ids": first, "hidden": hidden})

    @torch.no_grad()  # the graph runner captured (and fills its static buffers) under no_grad
    def forward(
        self,
        batch: StepBatch,  # one query row per request, slots from 0 (``covers``)
        tokens: torch.Tensor,  # [B, 1] int64
        hidden: torch.Tensor,  # [B, 1, H]
    ) -> torch.Tensor:  # [B, H] each request's head output
        """One draft step of the chain: the host's cache lengths, then the replay."""
        size = batch.batch_size
        if not self.covers(batch.start, size) or any(q != 1 for q in batch.query_lens_host):
            raise ValueError(
                f"the captured draft step replays one row per request over every live slot from 0, within "
                f"{self.capture_sizes[-1]} requests; got {size} request(s) from slot {batch.start} with "
                f"{len(self.cache.lengths)} live, query lengths {list(batch.query_lens_host)}"
            )
        inputs = {"input_ids": tokens.reshape(size), "hidden": hidden.reshape(size, -1)}
        return replay_planned(self.graph, self.cache, batch, inputs | {"seq_lens": batch.seq_lens})


def capture_head_step(
    head: ChainHead, cache: RaggedKVCache, backend: Backend | None, max_num_seqs: int, chain: int = 0
) -> CapturedHeadStep | None:
    """A ``CapturedHeadStep`` (with a greedy ``chain`` graph where the backend captures draft chains),
    unless no backend is given (``enforce_eager``), the backend does not capture graphs, its graph
    budget is spent, or the head selects weights by draft index (module docstring)."""
    if backend is None:
        return None
    if head.step_kinds() > 1:
        logger.info(
            "the %s head's draft steps run eagerly: each of its %d layers is fed the chain rows it lacks",
            type(head).__name__,
            head.step_kinds(),
        )
        return None
    if not capture_allowed(backend, None, "the draft head's step"):
        return None
    cache.zero_all()  # captured attention reads every position of the slots it covers
    chain = chain if backend.captures_draft_chains else 0
    what = f"the draft steps of {type(head).__name__}"
    return captured_or_refused(
        lambda: CapturedHeadStep(head, cache, backend, max_num_seqs, chain), backend, what
    )


__all__ = ["CapturedHeadStep", "capture_head_step"]
