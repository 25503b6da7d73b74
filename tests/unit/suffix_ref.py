"""Slow reference of :mod:`spec_backend.proposers.suffix`: the original dict-based suffix decoding.

Kept verbatim (classes renamed) so the tests can check the compiled proposer against it.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence

from suffix_ref_tree import HASH_MASK, HASH_MULT, M32
from suffix_ref_tree import ReferenceSuffixTree as SuffixTree

from spec_backend.proposers.base import Proposer, draft_limits

__all__ = ["ReferenceSuffixProposer"]


class _Request:
    """Per-request state: its tree, the hashes of the context's last 0..D tokens, and its output."""

    __slots__ = ("active", "output", "tree")

    def __init__(self, tree: SuffixTree, active: list[int]) -> None:
        self.tree = tree
        self.active = active  # active[d]: node hash of the last d tokens, d = 0..min(L, D - 1)
        self.output = array("i")


class ReferenceSuffixProposer(Proposer):
    """The original pure-Python suffix decoding (slow reference for tests)."""

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
        self._cached: deque[array[int]] = deque()  # FIFO of responses in the global tree
        self._order: dict[tuple[int, int], list[tuple[int, int]]] = {}  # match-length visiting orders

    # ----------------------------------------------------------------------------------------- state
    def add_request(self, req_id: str, prompt_token_ids: Sequence[int]) -> None:
        """Build the request's tree over its prompt (vectorised)."""
        prompt = [int(t) for t in prompt_token_ids]
        tree = SuffixTree(self.max_tree_depth)
        tree.insert(prompt)
        tail = prompt[len(prompt) - min(len(prompt), self.max_tree_depth - 1) :]
        active = [0]
        for d in range(1, len(tail) + 1):  # active[d]: hash of the last d tokens, read left to right
            h = 0
            for tok in tail[len(tail) - d :]:
                h = (h * HASH_MULT + tok + 1) & HASH_MASK
            active.append(h)
        self._reqs[req_id] = _Request(tree, active)

    def update(self, req_id: str, new_token_ids: Sequence[int]) -> None:
        """Count every new substring ending at each appended token (D dict updates per token)."""
        req = self._reqs[req_id]
        new_tokens = [int(t) for t in new_token_ids]
        req.output.extend(new_tokens)
        nodes = req.tree.nodes
        get, mult, mask, m32, best_field = nodes.get, HASH_MULT, HASH_MASK, M32, M32 << 32
        depth = self.max_tree_depth
        active = req.active
        for tok in new_tokens:
            x1 = tok + 1
            x1_field = x1 << 32  # the (best + 1) field of a parent whose best child is tok
            new = [0, x1]
            push = new.append
            nodes[x1] = get(x1, 0) + 1
            for parent in active[1:]:  # parents at depths 1..D-1, children at 2..D
                child = (parent * mult + x1) & mask
                value = get(child, 0) + 1
                nodes[child] = value
                push(child)
                pv = nodes[parent]
                if pv & best_field == x1_field or value & m32 >= pv >> 64:
                    nodes[parent] = (pv & m32) | x1_field | (value & m32) << 64
            del new[depth:]
            active = new
        req.active = active

    def remove_request(self, req_id: str) -> None:
        """Drop the request; its response enters the global tree (FIFO-evicting the oldest)."""
        req = self._reqs.pop(req_id, None)
        if req is None or self.max_cached_requests == 0 or len(req.output) == 0:
            return
        self.global_tree.insert(req.output)
        self._cached.append(req.output)
        while len(self._cached) > self.max_cached_requests:
            self.global_tree.remove(self._cached.popleft())

    @property
    def num_cached_responses(self) -> int:
        return len(self._cached)

    @property
    def num_nodes(self) -> int:
        """Nodes in all request trees plus the global tree."""
        return self.global_tree.num_nodes + sum(r.tree.num_nodes for r in self._reqs.values())

    @property
    def memory_bytes(self) -> int:
        """Estimated host bytes of all trees and cached responses."""
        trees = self.global_tree.memory_bytes + sum(r.tree.memory_bytes for r in self._reqs.values())
        outputs = sum(r.output.itemsize * len(r.output) for r in self._reqs.values())
        cached = sum(a.itemsize * len(a) for a in self._cached)
        return trees + outputs + cached

    # ---------------------------------------------------------------------------------------- propose
    def propose(self, req_ids: Sequence[str], max_tokens: Sequence[int] | None = None) -> list[list[int]]:
        limits = draft_limits(self.num_speculative_tokens, len(req_ids), max_tokens)
        use_global = self.global_tree.num_nodes > 0
        out: list[list[int]] = []
        for req_id, k in zip(req_ids, limits, strict=True):
            req = self._reqs[req_id]
            if k == 0:
                out.append([])
                continue
            score, draft = self._search(req.tree, req.active, k, own=True)
            if use_global:
                _, g_draft = self._search(self.global_tree, req.active, k, own=False, floor=score)
                draft = g_draft or draft  # non-empty only when it scores strictly higher
            out.append(draft)
        return out

    def _search(
        self, tree: SuffixTree, active: list[int], k: int, own: bool, floor: float = 0.0
    ) -> tuple[float, list[int]]:
        """Best (score, draft) with score > ``floor`` over match lengths in one tree, else (floor, [])."""
        nodes = tree.nodes
        depth, factor, min_prob = self.max_tree_depth, self.max_spec_factor, self.min_token_prob
        order = self._order.get((len(active), k))
        if order is None:  # (budget, m) for m = len(active) - 1 .. 1, largest budget first, then longest
            pairs = [(min(k, int(factor * m), depth - m), m) for m in range(len(active) - 1, 0, -1)]
            order = sorted((p for p in pairs if p[0] > 0), key=lambda p: (-p[0], -p[1]))
            self._order[(len(active), k)] = order
        best_score, best_draft = floor, []
        walked: set[tuple[int, int]] = set()
        for budget, m in order:
            if budget <= best_score:
                break  # a draft scores at most its length: nothing left can win
            value = nodes.get(active[m], 0)
            parent_count = (value & M32) - (1 if own else 0)
            if parent_count <= 0:
                continue  # no earlier occurrence of this context
            if (budget, parent_count) in walked:
                continue  # same occurrences as a longer match (nested sets, equal size): same walk
            walked.add((budget, parent_count))
            node, d = active[m], m
            draft: list[int] = []
            score, cum = 0.0, 1.0
            while len(draft) < budget:
                tok1 = (value >> 32) & M32  # best child token + 1; 0: leaf
                if tok1 == 0:
                    break
                child_count = value >> 64
                cum *= child_count / parent_count
                if cum < min_prob:
                    break
                draft.append(tok1 - 1)
                score += cum
                node = (node * HASH_MULT + tok1) & HASH_MASK
                value = nodes.get(node, 0)
                d += 1
                parent_count = child_count - (1 if own and d < len(active) and active[d] == node else 0)
                if parent_count <= 0:
                    break
            if score > best_score:
                best_score, best_draft = score, draft
        return best_score, best_draft
