"""Suffix decoding: frequency-weighted drafts from the request's own history and from past responses.

Two kinds of :class:`~spec_backend.proposers.suffix_tree.SuffixTree` (depth ``D =
suffix_decoding_max_tree_depth``):

- one per request over its prompt + output, built when the request joins and extended on each
  :meth:`SuffixProposer.update` (D count updates per appended token);
- one global tree over the responses (outputs) of finished requests, holding at most
  ``suffix_decoding_max_cached_requests`` of them; the oldest is evicted first and its counts are
  subtracted exactly, so the global tree only ever holds the nodes of the cached responses
  (``num_nodes <= D * sum(len(response))``). 0 disables it.

Drafting, per request: for each tree and each match length ``m`` (the last ``m`` context tokens form a
node seen before), walk from that node to its most frequent child while the cumulative probability
(product of ``count(child) / count(parent)``) stays ``>= suffix_decoding_min_token_prob``, for at most
``budget(m) = min(K, max_tokens, floor(max_spec_factor * m), D - m)`` tokens. A candidate's score is
its expected number of accepted tokens (sum of the cumulative probabilities); the best-scoring draft
wins (ties: the request tree, then the larger budget, then the longer match). Candidates are visited
by decreasing budget, and the search stops once no budget left can beat the best score (a draft scores
at most its length); a match whose occurrence set equals an already walked one (nested sets of equal
size) is skipped. In the request tree the context's own, still-unfinished occurrence is not counted in
a parent's count, as it has no next token yet.

Cost: D hash-table updates per appended token and a few dozen probes per proposal, each in a
compiled (numba) kernel called once per request per ``update`` / ``propose``
(:mod:`spec_backend.proposers.suffix_kernels`). Memory: 24 bytes per table slot at load <= 3/4, up to
D nodes per history token (about 6 MB for an 8k-token code prompt at D = 24); see ``memory_bytes``.
``tests/unit/suffix_ref.py`` keeps the original pure-Python implementation, which the tests
check this one against draft for draft.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from spec_backend.proposers import suffix_kernels as kernels
from spec_backend.proposers.base import Proposer, draft_limits
from spec_backend.proposers.suffix_tree import SuffixTree

if TYPE_CHECKING:
    import torch

    from spec_backend.config import SpeculativeConfig

__all__ = ["SuffixProposer", "build_suffix_proposer"]


class _Request:
    """Per-request state: its tree, the hashes of the context's last 0..D-1 tokens, and its output."""

    __slots__ = ("active", "alen", "output", "tree")

    def __init__(self, tree: SuffixTree) -> None:
        self.tree = tree
        self.active = np.zeros(tree.max_depth, dtype=np.uint64)  # [D]: hash of the last d tokens at d
        self.alen = 1  # active[:alen] is valid: d = 0..min(L, D - 1)
        self.output = array("i")


class SuffixProposer(Proposer):
    """Model-free suffix decoding (own implementation; compiled with numba)."""

    def __init__(
        self,
        num_speculative_tokens: int,
        max_tree_depth: int = 24,
        max_cached_requests: int = 10000,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
    ) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens={num_speculative_tokens} must be >= 1")
        if max_tree_depth < 1:
            raise ValueError(f"suffix_decoding_max_tree_depth={max_tree_depth} must be >= 1")
        if max_cached_requests < 0:
            raise ValueError(f"suffix_decoding_max_cached_requests={max_cached_requests} must be >= 0")
        if max_spec_factor < 0:
            raise ValueError(f"suffix_decoding_max_spec_factor={max_spec_factor} must be >= 0")
        if not 0.0 <= min_token_prob <= 1.0:
            raise ValueError(f"suffix_decoding_min_token_prob={min_token_prob} must be in [0, 1]")
        self.num_speculative_tokens = num_speculative_tokens
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self._reqs: dict[str, _Request] = {}
        self.global_tree = SuffixTree(max_tree_depth, removable=True)
        self._cached: deque[tuple[str, array[int]]] = deque()  # FIFO of (req_id, response) in the global tree

    # ----------------------------------------------------------------------------------------- state
    def add_request(self, req_id: str, prompt_token_ids: Sequence[int]) -> None:
        """Build the request's tree over its prompt (compiled, ~D table updates per token)."""
        req = _Request(SuffixTree(self.max_tree_depth))
        prompt = np.asarray(prompt_token_ids, dtype=np.int64).reshape(-1)
        req.tree.reserve(int(prompt.shape[0]) * min(self.max_tree_depth, 16))  # skip most regrowths
        req.alen = req.tree.extend(req.active, 1, prompt)
        self._reqs[req_id] = req

    def update(self, req_id: str, new_token_ids: Sequence[int]) -> None:
        """Count every new substring ending at each appended token (D table updates per token)."""
        req = self._reqs[req_id]
        new = np.asarray(new_token_ids, dtype=np.int64).reshape(-1)  # [T]
        req.output.frombytes(new.astype(np.int32).tobytes())
        tree = req.tree
        if new.shape[0] * self.max_tree_depth + tree.meta[0] > tree.limit or new.shape[0] > 64:
            req.alen = tree.extend(req.active, req.alen, new)  # grows the table first
        else:
            req.alen = kernels.extend(tree.tab, tree.meta, req.active, req.alen, new, self.max_tree_depth)

    def remove_request(self, req_id: str) -> None:
        """Drop the request; its response enters the global tree (FIFO-evicting the oldest)."""
        req = self._reqs.pop(req_id, None)
        if req is None or self.max_cached_requests == 0 or len(req.output) == 0:
            return
        self.global_tree.insert(req.output)
        self._cached.append((req_id, req.output))
        while len(self._cached) > self.max_cached_requests:
            self.global_tree.remove(self._cached.popleft()[1])

    def evict_cached_response(self, req_id: str) -> None:
        """Take ``req_id``'s responses out of the global tree (exact count subtraction); a request id
        that comes back (e.g. a preempted request restarting) then starts from a clean slate."""
        kept: deque[tuple[str, array[int]]] = deque()
        for cached_id, output in self._cached:
            if cached_id == req_id:
                self.global_tree.remove(output)
            else:
                kept.append((cached_id, output))
        self._cached = kept

    @property
    def active_request_ids(self) -> set[str]:
        return set(self._reqs)

    @property
    def cached_request_ids(self) -> set[str]:
        return {cached_id for cached_id, _ in self._cached}

    def response_tail(self, req_id: str, n: int) -> list[int]:
        """The last ``n`` tokens added to ``req_id`` with ``update`` (fewer when it has fewer)."""
        output = self._reqs[req_id].output
        return list(output[max(0, len(output) - n) :])

    @property
    def num_cached_responses(self) -> int:
        return len(self._cached)

    @property
    def num_nodes(self) -> int:
        """Nodes in all request trees plus the global tree."""
        return self.global_tree.num_nodes + sum(r.tree.num_nodes for r in self._reqs.values())

    @property
    def memory_bytes(self) -> int:
        """Host bytes of all trees, request states and cached responses."""
        trees = self.global_tree.memory_bytes + sum(r.tree.memory_bytes for r in self._reqs.values())
        states = sum(r.active.nbytes + r.output.itemsize * len(r.output) for r in self._reqs.values())
        cached = sum(a.itemsize * len(a) for _, a in self._cached)
        return trees + states + cached

    # ---------------------------------------------------------------------------------------- propose
    def propose(self, req_ids: Sequence[str], max_tokens: Sequence[int] | None = None) -> list[list[int]]:
        """Per request, one compiled search of its tree and (if non-empty) the global tree."""
        limits = draft_limits(self.num_speculative_tokens, len(req_ids), max_tokens)
        g = self.global_tree
        use_global = g.num_nodes > 0
        depth, factor, min_prob = self.max_tree_depth, float(self.max_spec_factor), float(self.min_token_prob)
        buf: npt.NDArray[np.int64] = np.empty(max(self.num_speculative_tokens, 1), dtype=np.int64)
        out: list[list[int]] = []
        for req_id, k in zip(req_ids, limits, strict=True):
            req = self._reqs[req_id]
            if k == 0:
                out.append([])
                continue
            t = req.tree
            n = kernels.propose_one(
                t.tab,
                t.meta,
                g.tab,
                g.meta,
                use_global,
                req.active,
                req.alen,
                k,
                depth,
                factor,
                min_prob,
                buf,
            )
            out.append(buf[:n].tolist())
        return out


def build_suffix_proposer(config: SpeculativeConfig, device: torch.device | None = None) -> SuffixProposer:
    """The ``suffix`` method's proposer from a validated config (a host algorithm: ``device`` is unused).
    K defaults to the tree depth, as the config's own default does."""
    depth = config.suffix_decoding_max_tree_depth
    return SuffixProposer(
        num_speculative_tokens=config.num_speculative_tokens or depth,
        max_tree_depth=depth,
        max_cached_requests=config.suffix_decoding_max_cached_requests,
        max_spec_factor=config.suffix_decoding_max_spec_factor,
        min_token_prob=config.suffix_decoding_min_token_prob,
    )
