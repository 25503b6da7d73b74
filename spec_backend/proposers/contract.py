"""The drafter contract: one interface for every drafting method, model-free or model-based.

The engine runs each step as **forward → verify → accept → draft-next** (vLLM's order). After a step's
tokens are accepted, the drafter receives a :class:`DraftInputs` — the step's :class:`StepBatch`, the
target's :class:`TargetOutput` (logits plus the hidden states the drafter declared in
``Drafter.hidden_states``), the tokens each request accepted, and per-request draft budgets — and
returns a :class:`DraftOutput`: draft ids ``[B, K]`` on the device, per-request counts, and optionally
the draft probabilities ``[B, K, V]`` the drafts were sampled from (probabilistic verification).

Glossary:

* *committed rows* — the query rows of this step whose tokens are now part of a request (a prefill's
  prompt rows; a decode step's first token plus its accepted drafts); their hidden states are valid;
* *aux layer id* ``l`` — the hidden state entering decoder layer ``l`` (the residual stream, what
  vLLM's EAGLE-3 ``aux_hidden_states`` hold); ``l == num_hidden_layers`` is the last layer's output
  before the final norm;
* *budget* — most drafts a request may get this step (its remaining tokens and cache room, or 0 when
  speculation is off for the batch).

Model-free drafters (ngram, ngram_gpu, suffix) keep their host algorithms behind ``HostDrafter``
(``proposers.host_drafter``).
A drafter is built from a :class:`DrafterContext` (the config, the device, the loaded target and engine
sizes) by the builder its row of the method table names (``spec_backend.proposers.registry``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from spec_backend.proposers.dynamic_tree import Grower, grow_dynamic_tree
from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID
from spec_backend.step import HiddenStateRequest, SlotCache, StepBatch, TargetOutput

if TYPE_CHECKING:
    from spec_backend.backends.base import Backend
    from spec_backend.config import SpeculativeConfig
    from spec_backend.runtime.kv_cache import RaggedKVCache


@dataclass(frozen=True)
class DrafterContext:
    """What a drafter builder may use: the resolved config, the device, the loaded target and engine sizes.

    ``num_slots`` is an upper bound (``max_num_seqs``): caches are sized later by ``allocate_caches``.

    ``load_model(path, dtype)`` loads a causal LM (folder or GGUF) with the engine's attention and
    backend preparation; ``dtype=None`` means the target's dtype. ``prepare(head)`` applies the same
    preparation (kernel choices, ``speculative_config['quantization']``) to a loaded head module.
    """

    config: SpeculativeConfig
    device: torch.device
    target: torch.nn.Module
    num_slots: int
    max_model_len: int
    load_model: Callable[[str, torch.dtype | None], torch.nn.Module]
    kv_transfer_config: dict[str, Any] | None = None
    target_vocab: dict[str, int] | None = None  # the target tokenizer's token -> id map, when it has one
    backend: Backend | None = None  # for drafters that capture graphs (None: they run eagerly)
    enforce_eager: bool = True
    target_path: str | None = None  # the target checkpoint's folder (MTP layers live there)
    prepare: Callable[[torch.nn.Module], None] | None = None  # the backend's preparation of draft heads

    def model_path(self, what: str) -> str:
        """``speculative_config.model``; ``ValueError`` saying the method needs ``what`` when unset."""
        if self.config.model is None:
            raise ValueError(f"method={self.config.method!r} needs speculative_config['model'] ({what})")
        return self.config.model


class DraftRequest(Protocol):
    """What a drafter may read about a request (the engine's ``Request`` satisfies it)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    seed: int

    @property
    def num_tokens(self) -> int: ...

    @property
    def temperature(self) -> float: ...


@dataclass(frozen=True)
class AcceptedTokens:
    """This step's outcome per request: tokens appended (accepted drafts + recovered/bonus, after stop
    checks) and drafts accepted. A prefill appends its first token and accepts nothing."""

    #: host [B]: the tokens appended since the drafter last saw the request: this step's, and the held
    #: steps' before it for a drafter that ``defers_follow``
    new_token_ids: tuple[list[int], ...]
    num_accepted: tuple[int, ...]  # host [B]
    is_prefill: bool


@dataclass(frozen=True)
class DraftInputs:
    """Everything a drafter receives after a step (see the module docstring)."""

    batch: StepBatch
    target: TargetOutput
    accepted: AcceptedTokens
    requests: Sequence[DraftRequest]
    budgets: tuple[int, ...]  # host [B]


@dataclass(frozen=True)
class DraftOutput:
    """Drafts for the next step: ids ``[B, K]`` (``PLACEHOLDER_TOKEN_ID`` past each count), counts,
    optional probabilities ``[B, K, V]`` the drafts were sampled from, per-request failures, and, from
    drafters with a confidence head, each draft's probability of acceptance given that the drafts before
    it are accepted (``engine/confidence.py`` chooses how many drafts to verify from it)."""

    token_ids: torch.Tensor  # [B, K] int64
    num_draft_tokens: tuple[int, ...]  # host [B]
    draft_probs: torch.Tensor | None = None  # [B, K, V] float32
    errors: tuple[str | None, ...] = field(default=())  # host [B] or empty: a message fails that request
    confidence: torch.Tensor | None = None  # [B, K] float32 in [0, 1]
    #: a token tree's shape: per request its nodes' parents (-1: the root), parents first, level by level
    tree_parents: tuple[tuple[int, ...], ...] | None = None  # host [B][n_b]


@dataclass(frozen=True)
class FlightTokens:
    """A step launched and not landed, as a drafter drafting after it sees it (``Drafter.propose_ahead``):
    its emitted tokens on the device, nothing read to the host."""

    emitted: torch.Tensor  # [B, W] int64: each request's emitted tokens, placeholders after them
    counts: torch.Tensor  # [B] int64: each request's emitted tokens (1 .. W)
    before: torch.Tensor  # [B] int64: each request's tokens before the step
    fed: torch.Tensor  # [B] int64: the step's first query token (each request's newest token before it)
    #: the target's hidden states of the step's query rows, where its forward recorded them (a drafter
    #: that reads them: EAGLE-style heads): post-norm final ``[B, q, H]``, auxiliary ``[B, q, n_aux, H]``
    final: torch.Tensor | None = None
    aux: torch.Tensor | None = None

    @property
    def accepted(self) -> torch.Tensor:  # [B] int64
        """Each request's accepted drafts: the row of its bonus token (the last emitted)."""
        return (self.counts - 1).clamp(min=0)

    @property
    def bonus(self) -> torch.Tensor:  # [B] int64
        """Each request's bonus token: its last emitted token, the next step's first query token."""
        return self.emitted.gather(1, self.accepted[:, None]).squeeze(1)

    def at_bonus(self, rows: torch.Tensor) -> torch.Tensor:  # [B, q, ...] -> [B, ...]
        """Each request's row of ``rows`` (one per query row of the step) at its bonus token's row."""
        index = self.accepted.view(-1, *([1] * (rows.dim() - 1))).expand(-1, 1, *rows.shape[2:])
        return rows.gather(1, index).squeeze(1)


class Drafter(ABC):
    """Every drafting method. ``num_speculative_tokens`` is K; ``hidden_states`` what it reads."""

    num_speculative_tokens: int
    hidden_states: HiddenStateRequest = HiddenStateRequest()
    #: whether it emits drafts at all (``extract_hidden_states`` only records)
    drafts: bool = True
    #: whether its ``DraftOutput`` carries ``confidence`` (a confidence head: DSpark)
    reports_confidence: bool = False
    #: whether its state is its requests' tokens alone, so steps that draft for no request may skip it
    #: entirely: its next call (``follow``, ``shadow``, ``propose``, or ``take_tokens`` before a request
    #: leaves) hands it every token appended since in one list per request (``AcceptedTokens``). A drafter
    #: whose state advances with a forward or the target's hidden states cannot (the default)
    defers_follow: bool = False
    #: whether ``shadow`` drafts (a host lookup); the engine plans its steps around the shadows' dates
    can_shadow: bool = False
    #: whether ``propose_ahead`` drafts after a step the host has not landed (its tokens, and the target's
    #: hidden states of its rows, on the device): async speculative steps (``engine/spec_ahead.py``). A
    #: drafter that ``defers_follow``, or one that ``landed_ahead`` tells when the step lands
    drafts_ahead: bool = False

    def cache_bytes_per_slot(self) -> int:
        """Bytes of cache one slot costs (for the engine's memory budget; default: no cache)."""
        return 0

    def allocate_caches(self, num_slots: int) -> None:
        """Preallocate ``num_slots`` slots of the caches ``caches()`` returns (called once, at start-up)."""
        del num_slots

    def caches(self) -> Sequence[SlotCache]:
        """Caches that live in the engine's slot table next to the target's (default: none)."""
        return ()

    def prefix_caches(self) -> Sequence[RaggedKVCache]:
        """Those of ``caches()`` whose positions are a function of the prompt tokens alone, so the prefix
        cache may store and reload them (a draft model's KV). A request admitted with a hit finds them
        holding the hit's positions at ``add_request``. Default: none (the drafter rebuilds its state
        from the prefill's rows, which show the whole prompt)."""
        return ()

    def add_request(self, request: DraftRequest) -> None:  # noqa: B027 - optional hook
        """A request joined (its slot is the last one of every cache in ``caches()``)."""

    def remove_request(self, request_id: str) -> None:  # noqa: B027 - optional hook
        """A request left (finished or aborted); forget it. Unknown ids are ignored."""

    def finish_request(self, request: DraftRequest) -> dict[str, Any] | None:
        """A request finished normally; return what to report in its ``kv_transfer_params``."""
        del request
        return None

    def follow(self, inputs: DraftInputs) -> tuple[str | None, ...] | None:
        """A step that drafts for no request (every budget is 0: adaptive drafting chose plain decoding,
        or speculation is off for the batch): take in the accepted tokens without drafting and return the
        per-request failures (``None``: none), so the step costs what a plain step does. ``None`` instead
        (the default) has the engine call ``propose`` as usual: a drafter whose state advances with its
        own forward or the target's hidden states (a draft model's KV cache) cannot skip it."""
        del inputs
        return None

    def take_tokens(
        self, requests: Sequence[DraftRequest], new_token_ids: Sequence[list[int]]
    ) -> tuple[str | None, ...]:
        """A drafter that ``defers_follow``: take in the tokens ``requests`` appended since it last saw them
        (before they leave: a suffix proposer then caches whole responses), returning per-request failures.
        Never called on other drafters."""
        del requests, new_token_ids
        raise NotImplementedError(f"{type(self).__name__} does not defer following (defers_follow is False)")

    def shadow(self, inputs: DraftInputs) -> tuple[list[list[int]], tuple[str | None, ...]] | None:
        """Like ``follow``, and drafts within ``inputs.budgets`` as host lists that will not be verified,
        with the per-request failures (``engine/shadow_drafts.py``). ``None`` (the default): the drafter
        cannot draft for little (only a host lookup can), and the engine calls ``follow``."""
        del inputs
        return None

    def propose_ahead(
        self, requests: Sequence[DraftRequest], flight: FlightTokens, budgets: Sequence[int]
    ) -> torch.Tensor:  # [B, K] int64, placeholders past each request's drafts
        """A drafter that ``drafts_ahead``: the drafts after ``flight``'s tokens (a step not landed;
        nothing read to the host). When the step lands, its tokens reach the drafter by its next
        ``take_tokens`` (a drafter that ``defers_follow``) or ``landed_ahead``."""
        del requests, flight, budgets
        raise NotImplementedError(f"{type(self).__name__} does not draft ahead (drafts_ahead is False)")

    def ready_ahead(self, requests: Sequence[DraftRequest]) -> bool:
        """Whether ``propose_ahead`` may draft after the next step of ``requests``: its state is the one a
        draft-next of K drafts leaves (default: ``drafts_ahead``; a drafter whose state is its requests'
        tokens always is)."""
        del requests
        return self.drafts_ahead

    def landed_ahead(self, requests: Sequence[DraftRequest | None]) -> None:  # noqa: B027 - optional hook
        """A drafter that ``drafts_ahead`` and does not ``defer_follow``: the step it drafted after
        (``propose_ahead``) landed; ``requests`` in their slots (``None``: a request that ended there)."""

    @abstractmethod
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        """Drafts for the next step of ``inputs.requests`` (see the module docstring)."""

    def propose_tree(self, inputs: DraftInputs, parents: Sequence[int], ranks: Sequence[int]) -> DraftOutput:
        """A static token tree per request: ids ``[B, n]`` of the tree's nodes in its breadth-first order
        (``proposers.tree_build``), ``n`` counted for every request — or, with ``tree_parents``, the
        subtree each request found (n-gram lookup) — and the engine keeps the nodes within each budget's
        depth. Only the drafters of ``engine.tree_step.TREE_METHODS`` draft trees."""
        del inputs, parents, ranks
        raise NotImplementedError(f"{type(self).__name__} drafts chains, not token trees")

    def grower(self, inputs: DraftInputs) -> Grower:
        """What dynamic trees and multi-path drafts (``proposers.draft_paths.grow_paths``) grow from
        (``proposers.dynamic_tree.Grower``): the drafters of ``engine.tree_step.TREE_METHODS`` marked
        ``dynamic`` and ``paths``."""
        del inputs
        raise NotImplementedError(f"{type(self).__name__} does not grow token trees")

    @torch.inference_mode()
    def propose_dynamic_tree(self, inputs: DraftInputs, depth: int, top_k: int, nodes: int) -> DraftOutput:
        """EAGLE-2's tree per request (``proposers.tree_build.dynamic_tree``): ids ``[B, nodes]`` and
        ``tree_parents``, grown from ``grower``."""
        grown = self.grower(inputs)
        tokens, parents = grow_dynamic_tree(grown.root, grown.forward, grown.log_probs, depth, top_k, nodes)
        grown.done()
        return DraftOutput(tokens, (nodes,) * len(inputs.requests), tree_parents=parents)


def last_committed_rows(inputs: DraftInputs) -> torch.Tensor:
    """``[B]`` flat row of each request's last committed token this step (a prefill's last prompt row; a
    decode step's row of its last accepted draft, or of its first token when none was accepted)."""
    batch = inputs.batch
    if inputs.accepted.is_prefill:
        return batch.query_start_loc[1:] - 1
    accepted = torch.tensor(inputs.accepted.num_accepted, dtype=torch.int64)
    return batch.query_start_loc[:-1] + accepted.to(batch.query_start_loc.device)


def empty_drafts(batch_size: int, k: int, device: torch.device) -> DraftOutput:
    """No drafts for any request (every budget is 0)."""
    ids = torch.full((batch_size, max(k, 1)), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    return DraftOutput(ids, (0,) * batch_size)


def pack_drafts(drafts: Sequence[Sequence[int]], k: int, device: torch.device) -> torch.Tensor:
    """Host draft lists → ``[B, K]`` int64 padded with ``PLACEHOLDER_TOKEN_ID`` (one host tensor)."""
    width = max(k, 1)
    rows = []
    for b, draft in enumerate(drafts):
        if len(draft) > width:
            raise ValueError(f"request {b} has {len(draft)} drafts, more than the {width} columns allowed")
        rows.append([*draft, *([PLACEHOLDER_TOKEN_ID] * (width - len(draft)))])
    return torch.tensor(rows, dtype=torch.int64).reshape(len(drafts), width).to(device)


__all__ = [
    "AcceptedTokens",
    "DraftInputs",
    "DraftOutput",
    "DraftRequest",
    "Drafter",
    "DrafterContext",
    "FlightTokens",
    "empty_drafts",
    "last_committed_rows",
    "pack_drafts",
]
