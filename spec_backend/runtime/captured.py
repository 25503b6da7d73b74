"""The target's verify forward through the backend's graph runner (CUDA graphs, ACLGraph, or eager).

In a captured decode step every request carries exactly K+1 query tokens (its last token and K drafts;
missing drafts are ``PLACEHOLDER_TOKEN_ID`` rows, fed as token 0, never accepted by the sampler and
rolled back with the cache), so a batch of ``b`` requests is ``b·(K+1)`` tokens: the sizes
``plan_capture_sizes`` gives. A token-tree step is captured the same way at ``1 + nodes`` tokens per
request (padding nodes hang off the root), its per-request ancestor mask and depths graph inputs. The
graph runner pads a batch up to the next captured size (padding requests use free slots past the live
ones) and runs eagerly above the largest. Inside the captured callable everything is a device op on
static shapes: the cache's views span its whole capacity and the attention mask comes from the device
``seq_lens``. Host bookkeeping (cache lengths, zeroing) happens
before the replay. ``enforce_eager=True`` or a backend whose ``CapturePolicy.enabled`` is False (the
reference backend) skips all of this: the engine then runs the same step eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

import torch

from spec_backend.backends.base import Backend, GraphRunner
from spec_backend.graphs import GraphCaptureError, padded_size, plan_capture_sizes
from spec_backend.runtime.hf_compat import cache_kwargs
from spec_backend.runtime.runner import ModelRunner, num_decoder_layers
from spec_backend.runtime.static_batch import host_plan, static_step_batch
from spec_backend.step import RaggedAttentionMetadata, StepBatch, TargetOutput, build_step_batch

if TYPE_CHECKING:
    from spec_backend.runtime.captured_verify import CapturedVerify
    from spec_backend.runtime.kv_cache import RaggedKVCache

logger = logging.getLogger("spec_backend.engine")
T = TypeVar("T")


class CapturedDecode:
    """Forwards of ``runner`` at ``q`` tokens per request, replayed from captured graphs: the target's
    verify step (``q = K+1``) or a draft model's one-token decode step (``q = 1``)."""

    def __init__(
        self, runner: ModelRunner, backend: Backend, q: int, max_num_seqs: int, tree: bool = False
    ) -> None:
        if q < 1:
            raise ValueError(f"a captured step needs >= 1 token per request, got {q}")
        self.runner = runner
        self.q = q
        self.tree = tree  # a token-tree verify step: each request's ancestor mask and depths are inputs
        layers = num_decoder_layers(runner.model.config)
        self.capture_sizes = plan_capture_sizes(
            q - 1, max_num_seqs, backend=backend, num_hidden_layers=layers
        )
        self.graph: GraphRunner = backend.graph_runner(self._forward, self.capture_sizes)
        device = runner.cache.layout.device
        largest = self.capture_sizes[-1]
        example = {
            "input_ids": torch.zeros(largest, dtype=torch.int64, device=device),  # [N]
            "seq_lens": torch.full((largest,), self.q, dtype=torch.int64, device=device),  # [N]
        }
        if tree:
            eye = torch.eye(q, dtype=torch.bool, device=device).repeat(largest // q, 1)
            example |= {"tree": eye, "depths": torch.zeros(largest, dtype=torch.int64, device=device)}
        self.graph.capture(example)
        logger.info("captured a %d-token-per-request step for %s tokens", q, self.capture_sizes)
        #: the step's sampler, captured beside it (``captured_verify``; None: verified eagerly)
        self.verify: CapturedVerify | None = None
        #: whether the backend's captured attention reads the lengths from the device
        #: (``Backend.captures_draft_chains``): a replay may then run over seq lens the host has not read
        #: (a step launched ahead, ``engine/spec_ahead.py``); set by ``capture_steps``
        self.device_lengths = False
        self._plans: dict[int, StepBatch] = {}  # batch size -> the host plan of a step launched ahead

    def padded_tokens(self, num_requests: int) -> int | None:
        """The captured size a step of ``num_requests`` requests replays (``None``: it runs eagerly)."""
        return padded_size(num_requests * self.q, self.graph.capture_sizes)

    def _forward(
        self,
        input_ids: torch.Tensor,  # [N]
        seq_lens: torch.Tensor,  # [N] each request's seq len repeated per token
        tree: torch.Tensor | None = None,  # [N, q] bool: each token's visible columns (a tree step)
        depths: torch.Tensor | None = None,  # [N] int64: each token's depth below its request's first
    ) -> tuple[torch.Tensor, ...]:
        """The captured callable (a tree step also takes each token's mask row and depth)."""
        q, n = self.q, input_ids.shape[0]
        b = n // q
        cache = self.runner.cache
        batch = static_step_batch(input_ids, seq_lens.view(b, q)[:, 0], q, cache.capacity)
        rope = None
        if tree is not None and depths is not None:  # every row sees itself: padding rows are never empty
            eye = torch.eye(q, dtype=torch.bool, device=input_ids.device)
            visible = tree.view(b, q, q) | eye  # [B, Q, Q]
            meta = RaggedAttentionMetadata(
                batch.query_lens, batch.seq_lens, tree=visible, tree_depths=depths.view(b, q)
            )
            rope = (batch.seq_lens - q)[batch.rows] + depths  # [N] first + depth
            batch = replace(batch, attention=meta, rope_positions=rope)
        cache.plan = batch
        try:
            out = self.runner.model(
                input_ids=input_ids.view(b, q),
                position_ids=(rope if rope is not None else batch.positions).view(b, q),
                **cache_kwargs(self.runner.model, cache),
                use_cache=True,
                logits_to_keep=0,
                spec_attn_metadata=batch.attention,
            )
            logits = out.logits.reshape(n, -1).float()  # [N, V]
            final, aux = (
                self.runner.capture.collect(batch) if self.runner.capture is not None else (None, None)
            )
        finally:
            cache.plan = None
        return tuple(t for t in (logits, final, aux) if t is not None)

    @torch.no_grad()  # the graph runner captured (and fills its static buffers) under no_grad
    def forward(self, batch: StepBatch) -> TargetOutput:
        """One verify forward over ``batch`` (every request K+1 query tokens, slots from 0)."""
        if batch.start != 0 or any(length != self.q for length in batch.query_lens_host):
            raise ValueError(f"this captured step needs {self.q} token(s) per request from slot 0")
        inputs = {"input_ids": batch.input_ids, "seq_lens": batch.seq_lens[batch.rows]}  # [N] each
        if self.tree:
            meta = batch.attention
            if meta.tree is None or meta.tree_depths is None:
                raise ValueError("this captured step verifies token trees: the batch has no tree")
            inputs |= {"tree": meta.tree.reshape(-1, self.q), "depths": meta.tree_depths.reshape(-1)}
        return self._replay(batch, inputs)

    @torch.no_grad()
    def forward_ahead(
        self,
        input_ids: torch.Tensor,  # [B * q] int64
        seq_lens: torch.Tensor,  # [B] each request's seq len after this step, on the device only
    ) -> tuple[StepBatch, TargetOutput]:
        """A step of ``B`` requests from slot 0 whose seq lens the host has not read (a step launched
        ahead, ``engine/spec_ahead.py``; needs ``device_lengths``): the host reserves ``q`` positions per
        request (its lengths an upper bound) and nothing else is built on the host. Returns the step's
        batch (its host counts; its tensors a placeholder layout, made once per batch size) and output."""
        if not self.device_lengths or self.tree:
            raise ValueError("a step launched ahead needs a chain step whose attention reads device lengths")
        plan = host_plan(self._plans, seq_lens.shape[0], self.q, self.runner.cache.capacity, seq_lens.device)
        per_token = seq_lens if self.q == 1 else seq_lens.repeat_interleave(self.q)  # [N]
        return plan, self._replay(plan, {"input_ids": input_ids, "seq_lens": per_token})

    def _replay(self, batch: StepBatch, inputs: dict[str, torch.Tensor]) -> TargetOutput:
        """The host's lengths for ``batch`` (and lazy zeroing), then the replay over ``inputs``; the host
        lengths as they were if it raises."""
        cache = self.runner.cache
        saved = list(cache.lengths)
        try:
            cache.begin_step(batch)  # host lengths (and lazy zeroing) for the real requests
            cache.end_step()
            self.graph.set_step_lengths(batch.query_lens_host, cache.lengths[: batch.batch_size])
            out = self.graph.run(inputs)
        except BaseException:
            cache.lengths[: len(saved)] = saved
            raise
        outputs = out if isinstance(out, tuple) else (out,)
        hidden = self.runner.capture.request if self.runner.capture is not None else None
        final = outputs[1] if hidden is not None and hidden.final else None
        aux = outputs[-1] if hidden is not None and hidden.aux_layer_ids else None
        return TargetOutput(logits=outputs[0], final=final, aux=aux)


class CapturedChain:
    """A draft model's greedy draft chain after draft 1 replayed as one graph, on a backend whose
    captured attention reads device lengths (``Backend.captures_draft_chains``): ``chain`` one-token
    forwards of ``decode``'s callable, each draft the argmax of the logits before it (point-mass
    drafting, ``draft_sampling.select_drafts``), over lengths growing on the device."""

    def __init__(self, decode: CapturedDecode, backend: Backend, chain: int) -> None:
        if decode.q != 1 or decode.tree or chain < 1:
            raise ValueError(
                "a draft chain replays a one-token step (q=1, no tree) at least once; got "
                f"q={decode.q}, tree={decode.tree}, chain={chain}"
            )
        self.decode, self.chain = decode, chain
        self._plans: dict[int, StepBatch] = {}  # batch size -> the host plan of a chain launched ahead
        self.graph: GraphRunner = backend.graph_runner(self._chain, decode.capture_sizes)
        device, largest = decode.runner.cache.layout.device, decode.capture_sizes[-1]
        self.graph.capture(
            {
                "input_ids": torch.zeros(largest, dtype=torch.int64, device=device),  # [N]
                "seq_lens": torch.ones(largest, dtype=torch.int64, device=device),  # [N]
            }
        )
        logger.info(
            "captured the draft model's greedy chain of %d draft(s) for %s", chain, decode.capture_sizes
        )

    def _chain(
        self,
        input_ids: torch.Tensor,  # [N] draft 1
        seq_lens: torch.Tensor,  # [N] each request's tokens with draft 1 (padding: 0)
    ) -> torch.Tensor:  # [N, chain] int64 drafts 2..K
        """The captured callable: each draft fed back, its successor the argmax of the logits after it
        (``draft_sampling.select_drafts`` without probabilities), as the one-token steps and eager draws
        do."""
        ids, drafts = input_ids, []
        for step in range(self.chain):
            logits = self.decode._forward(ids, seq_lens + step)[0]  # [N, V]
            ids = logits.argmax(dim=-1)  # [N]
            drafts.append(ids)
        return torch.stack(drafts, dim=1)

    def chains(self, start: int, batch_size: int, drafts: int) -> bool:
        """Whether a step drafting ``drafts`` for ``batch_size`` requests from slot ``start`` replays the
        chain: every live slot from 0 (padding requests take the slots after it), all K drafts, and
        no more requests than the largest capture size (above it the ordinary eager steps are faster)."""
        decode = self.decode
        return drafts == self.chain + 1 and covers_live(
            start, batch_size, decode.runner.cache, decode.capture_sizes
        )

    @torch.no_grad()
    def forward(self, first: torch.Tensor) -> torch.Tensor:  # [B] -> [B, chain]
        """Drafts 2..K of every live request after draft 1 ``first``."""
        return replay_chain(self.graph, self.decode.runner.cache, self.chain, {"input_ids": first})

    @torch.no_grad()
    def forward_ahead(
        self,
        first: torch.Tensor,  # [B] draft 1 of every live request
        seq_lens: torch.Tensor,  # [B] each request's tokens with draft 1, on the device only
    ) -> torch.Tensor:  # [B, chain]
        """``forward`` over lengths the host has not read (a step launched ahead): the host reserves the
        chain's rows past its lengths (an upper bound), over a plan made once per batch size."""
        cache = self.decode.runner.cache
        plan = host_plan(self._plans, first.shape[0], self.chain, cache.capacity, first.device)
        return replay_planned(self.graph, cache, plan, {"input_ids": first, "seq_lens": seq_lens})


def covers_live(start: int, batch_size: int, cache: RaggedKVCache, capture_sizes: Sequence[int]) -> bool:
    """Whether a one-row-per-request step of ``batch_size`` requests from slot ``start`` may replay a
    drafter's captured step over ``cache``: it starts at slot 0 and covers every live slot (padding
    requests take the slots after it, which must be free), within the largest of ``capture_sizes`` (above
    it the callable would attend over whole slots eagerly: the ordinary eager step is faster)."""
    live = start == 0 and batch_size == len(cache.lengths)
    return live and padded_size(batch_size, capture_sizes) is not None


def replay_chain(
    graph: GraphRunner, cache: RaggedKVCache, chain: int, inputs: dict[str, torch.Tensor]
) -> torch.Tensor:  # [B, chain]
    """One replay of a captured draft chain of ``chain`` rows per request over every live slot of
    ``cache`` from 0: the host's lengths (and lazy zeroing) for all its rows first, then the graph on
    ``inputs`` (``input_ids [B]``: draft 1, and the graph's other inputs) and each request's ``seq_lens``
    with draft 1's row (restored if the replay raises)."""
    size = inputs["input_ids"].shape[0]
    if size != len(cache.lengths):
        raise ValueError(f"a captured draft chain covers every live slot ({len(cache.lengths)}), got {size}")
    cached = cache.lengths[:size]
    plan = build_step_batch(0, inputs["input_ids"].new_zeros((size, chain)), [chain] * size, cached)
    seq_lens = plan.seq_lens - (chain - 1)  # [B] the first row's: cached + 1
    return replay_planned(graph, cache, plan, inputs | {"seq_lens": seq_lens})


def replay_planned(
    graph: GraphRunner, cache: RaggedKVCache, plan: StepBatch, inputs: dict[str, torch.Tensor]
) -> torch.Tensor:  # the graph's output, [B, ...]
    """Reserve ``plan``'s rows in ``cache``'s host lengths (and zero lazily), hand the runner the real
    requests' lengths (``GraphRunner.set_step_lengths``), replay ``graph`` on ``inputs``; the lengths are
    restored if it raises."""
    saved = list(cache.lengths)
    try:
        cache.begin_step(plan)
        cache.end_step()
        graph.set_step_lengths(plan.query_lens_host, cache.lengths[: plan.batch_size])
        out = graph.run(inputs)
    except BaseException:
        cache.lengths[: len(saved)] = saved
        raise
    assert isinstance(out, torch.Tensor)
    return out


def step_graph(
    verify: CapturedDecode | None, plain: CapturedDecode | None, num_requests: int, drafts: bool
) -> CapturedDecode | None:
    """The graph a decode step of ``num_requests`` requests replays (None: it runs eagerly): without
    ``drafts``, the one-token graph ``plain`` where it replays no more rows than the verify graph (a backend
    short of graphs may have captured only its largest size, and a size above it runs eagerly), else
    ``verify``."""
    if verify is None or drafts or plain is None:
        return verify
    rows, widest = plain.padded_tokens(num_requests), verify.padded_tokens(num_requests)
    return plain if rows is not None and (widest is None or rows <= widest) else verify


def capture_chain(decode: CapturedDecode, backend: Backend, chain: int) -> CapturedChain | None:
    """A draft model's ``CapturedChain`` of ``chain`` drafts after draft 1 where the backend captures
    draft chains (``Backend.captures_draft_chains``) and ``chain`` >= 1; ``None`` otherwise."""
    if chain < 1 or not backend.captures_draft_chains:
        return None
    what = f"the draft chain of {type(decode.runner.model).__name__}"
    captured = captured_or_refused(lambda: CapturedChain(decode, backend, chain), backend, what)
    decode.runner.cache.zero_all()  # the example rows the capture wrote
    return captured


def capture_allowed(backend: Backend, num_hidden_layers: int | None, what: str) -> bool:
    """Whether ``backend`` captures graphs now: its policy enables them and, on a device whose graphs are
    counted, some are left (else a warning that ``what`` runs eagerly)."""
    policy = backend.capture_policy(num_hidden_layers)
    if not policy.enabled:
        return False
    if policy.graph_budget == 0:  # earlier runners (a drafter's, the verify step's) took every graph
        logger.warning("the %s backend has no graphs left: %s is not captured", backend.name, what)
        return False
    return True


def captured_or_refused(build: Callable[[], T], backend: Backend, what: str) -> T:
    """``build()``, whose capture failing is refused by name (``GraphCaptureError``: ``what`` and the way
    out); running out of memory is raised as it is (the way out is memory: ``max_num_seqs``, the KV
    cache's share, not ``enforce_eager`` alone)."""
    try:
        return build()
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # an op that cannot be captured: say so, and the way out
        raise GraphCaptureError(
            f"capturing {what} as graphs on the {backend.name} backend failed ({type(exc).__name__}: "
            f"{exc}); pass enforce_eager=True to run it without graphs"
        ) from exc


def maybe_capture(
    runner: ModelRunner,
    backend: Backend | None,
    q: int,
    max_num_seqs: int,
    enforce_eager: bool,
    tree: bool = False,
) -> CapturedDecode | None:
    """A ``CapturedDecode`` at ``q`` tokens per request (a token tree's root and nodes with ``tree``),
    unless ``enforce_eager``, no backend is given, or the backend does not capture graphs."""
    if enforce_eager or backend is None:
        return None
    if not capture_allowed(backend, num_decoder_layers(runner.model.config), f"the {q}-token step"):
        return None
    runner.cache.zero_all()  # captured attention reads every position of the slots it covers
    what = f"the decode step of {type(runner.model).__name__}"
    return captured_or_refused(lambda: CapturedDecode(runner, backend, q, max_num_seqs, tree), backend, what)


__all__ = [
    "CapturedChain",
    "CapturedDecode",
    "GraphCaptureError",
    "capture_allowed",
    "capture_chain",
    "captured_or_refused",
    "covers_live",
    "maybe_capture",
    "replay_chain",
    "replay_planned",
    "step_graph",
]
