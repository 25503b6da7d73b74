"""What every drafter with its own KV cache over target hidden states shares (EAGLE-style heads, DFlash).

The cache holds one row per *committed* token the head has been fed with target features; rows fed
while drafting are dropped at the next step (``rollback``). A request with nothing to feed in a forward
gets one dummy row, which is not counted and is dropped the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from spec_backend.proposers.contract import Drafter, DraftInputs, DraftRequest
from spec_backend.step import HiddenStateRequest, SlotCache, StepBatch, build_step_batch

if TYPE_CHECKING:
    from spec_backend.runtime.kv_cache import RaggedKVCache


class HeadCacheDrafter(Drafter):
    """A drafter owning one ``RaggedKVCache`` laid out after ``config`` (see the module docstring)."""

    def __init__(
        self,
        config: Any,
        param: torch.Tensor,
        hidden_states: HiddenStateRequest,
        k: int,
        max_model_len: int,
        probabilistic: bool,
    ) -> None:
        from spec_backend.runtime.kv_cache import kv_layout

        self.hidden_states = hidden_states
        self.num_speculative_tokens = k
        self.headroom = k  # cache positions past max_model_len a step may write (a tree level: its nodes)
        self.max_model_len = max_model_len
        self.probabilistic = probabilistic
        self.layout = kv_layout(config, param.dtype, param.device, attention_only=True)
        self.cache: RaggedKVCache | None = None
        self._rows: dict[str, int] = {}  # per request: cache rows fed with target hidden states

    def cache_bytes_per_slot(self) -> int:
        return self.layout.bytes_per_position * (self.max_model_len + self.headroom)

    def allocate_caches(self, num_slots: int) -> None:
        from spec_backend.runtime.kv_cache import RaggedKVCache

        self.cache = RaggedKVCache(self.layout, self.max_model_len, num_slots, headroom=self.headroom)

    def caches(self) -> Sequence[SlotCache]:
        return (self._cache(),)

    def _cache(self) -> RaggedKVCache:
        if self.cache is None:
            raise RuntimeError(f"the {type(self).__name__} cache was not allocated (allocate_caches)")
        return self.cache

    def add_request(self, request: DraftRequest) -> None:
        self._rows[request.request_id] = 0

    def remove_request(self, request_id: str) -> None:
        self._rows.pop(request_id, None)

    def features(self, inputs: DraftInputs) -> torch.Tensor:  # [N, F]
        """The target features this drafter declared: final ``[N, H]`` or aux ``[N, n·H]``."""
        target = inputs.target
        features = target.final if self.hidden_states.final else target.aux
        if features is None:
            raise RuntimeError(f"the target returned no {self.hidden_states} hidden states for the drafter")
        return features.flatten(1)

    def rollback(self, inputs: DraftInputs) -> None:
        """Truncate each request's cache to the rows fed with target features."""
        cache, start = self._cache(), inputs.batch.start
        for b, request in enumerate(inputs.requests):
            kept = self._rows.get(request.request_id, 0)
            cache.truncate(start + b, min(cache.lengths[start + b], kept))

    def step_batch(self, start: int, tokens: torch.Tensor, lens: Sequence[int]) -> StepBatch:
        """The head's forward over ``lens`` rows per request (a dummy row where a count is 0)."""
        cache = self._cache()
        query = [max(1, n) for n in lens]
        return build_step_batch(start, tokens, query, cache.lengths[start : start + len(query)])

    def mark_committed(self, inputs: DraftInputs, lens: Sequence[int], trailing: int = 0) -> None:
        """After a forward over committed rows (and ``trailing`` rows that are not): every cache row but
        the trailing ones was fed with target features."""
        cache, start = self._cache(), inputs.batch.start
        for b, request in enumerate(inputs.requests):
            if lens[b]:  # a dummy row is not a row fed with target hidden states
                self._rows[request.request_id] = cache.lengths[start + b] - trailing


__all__ = ["HeadCacheDrafter"]
