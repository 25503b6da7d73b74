"""The engine's use of the prefix cache (``runtime/prefix_cache.py``): hits at admission, a prefill
of the rest, entries stored after it, and a drafter that sees the whole prompt.

* **Admission** (``admit``): a request's prompt is looked up and the hit is copied into its slot of the
  target's cache and of each drafter cache that is a function of the tokens alone (a draft model's:
  ``Drafter.prefix_caches``); ``Request.num_cached_tokens`` says how many positions came from the cache.
  A request asking for ``prompt_logprobs`` takes no hit (every prompt row's logits are computed).
* **Prefill**: only the positions after the hit are fed to the target.
* **Drafting after the prefill** (``drafter_view``): the drafter receives the step as if the whole
  prompt had been computed: a batch of every prompt row, and the target's hidden states of every row
  (the hit's from the cache, the rest from this forward). A drafter thus builds exactly the state it
  builds without a hit (EAGLE-style heads recompute their own caches from these rows: their first
  layer reads the *next* token, which a block's content key cannot promise).
* **Storing** (``remember``): after the prefill (and the drafter's catch-up, which fills a draft model's
  cache), every whole prompt block is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spec_backend.engine.request import Request
from spec_backend.runtime.kv_cache import RaggedKVCache
from spec_backend.runtime.prefix_cache import NO_HIT, Hit, PrefixCache
from spec_backend.step import StepBatch, TargetOutput, build_step_batch

logger = logging.getLogger("spec_backend.engine")

#: default positions per block (vLLM's default ``block_size``)
DEFAULT_BLOCK_SIZE = 16
#: default memory of the prefix cache, in full-length requests' KV (allocated as blocks are stored; at
#: most ``kv_cache_memory_bytes`` when that is set)
DEFAULT_REQUESTS = 4


@dataclass(frozen=True)
class PrefixSettings:
    """``LLM``'s prefix-caching arguments, checked: on or off, block size, memory budget in bytes
    (``None``: ``DEFAULT_REQUESTS`` full-length requests of every prefix-cacheable cache)."""

    enabled: bool = True
    block_size: int = DEFAULT_BLOCK_SIZE
    memory_bytes: int | None = None
    #: the user asked for prefix caching or set one of its sizes (the default is on without asking)
    explicit: bool = False

    @classmethod
    def parse(cls, enabled: Any, block_size: Any, memory_bytes: Any) -> PrefixSettings:
        if enabled is not None and not isinstance(enabled, bool):
            raise ValueError(f"enable_prefix_caching must be a bool or None (on), got {enabled!r}")
        if block_size is not None and (
            isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= 4096
        ):
            raise ValueError(f"block_size must be None (16) or an int in [1, 4096], got {block_size!r}")
        if memory_bytes is not None and (
            isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 1
        ):
            raise ValueError(
                f"prefix_cache_memory_bytes must be None or an int >= 1 (bytes), got {memory_bytes!r}"
            )
        if enabled is False and memory_bytes is not None:
            raise ValueError(
                f"prefix_cache_memory_bytes={memory_bytes} sizes the prefix cache, but "
                "enable_prefix_caching=False turns it off: leave one of them unset"
            )
        size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
        explicit = enabled is True or block_size is not None or memory_bytes is not None
        return cls(enabled is not False, size, memory_bytes, explicit)

    def unsupported(self, shown: str, reason: str) -> PrefixSettings:
        """Off for a model the prefix cache cannot serve (``reason``); an error naming it when the user
        asked for prefix caching or sized it."""
        if self.enabled and self.explicit:
            raise ValueError(
                f"prefix caching (enable_prefix_caching / block_size / prefix_cache_memory_bytes) cannot run "
                f"with model {shown}: {reason}; leave those unset or pass enable_prefix_caching=False"
            )
        return PrefixSettings(enabled=False, block_size=self.block_size)

    def for_model(self, shown: str, recurrent: bool) -> PrefixSettings:
        """These settings, turned off (an error when asked for explicitly) for a model with recurrent
        state, which cached prefixes do not store."""
        if not (recurrent and self.enabled):
            return self
        reason = "its linear-attention layers keep recurrent state, which cached prefixes do not store"
        logger.info("prefix caching is off for %s: %s", shown, reason)
        return self.unsupported(shown, reason)


def _rows(target: torch.Tensor | None, loc: Sequence[int], b: int) -> torch.Tensor | None:
    return None if target is None else target[loc[b] : loc[b + 1]]


def _counters(registry: Any) -> list[tuple[Any, Any]]:
    """(queries, hits) counters of prompt tokens, under our prefix and vLLM's."""
    from prometheus_client import Counter

    return [
        (
            Counter(
                f"{prefix}prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache",
                registry=registry,
            ),
            Counter(
                f"{prefix}prefix_cache_hits", "Prompt tokens served from the prefix cache", registry=registry
            ),
        )
        for prefix in ("spec_backend_", "vllm:")
    ]


class PrefixHits:
    """The prefix cache plus the hits of the requests being admitted (see the module docstring).

    ``registry``: a ``prometheus_client`` registry that gets the lifetime counters of prompt tokens
    looked up and served, under our names and vLLM's (``vllm:prefix_cache_queries`` / ``_hits``)."""

    def __init__(self, cache: PrefixCache, registry: Any | None = None) -> None:
        self.cache = cache
        self._hits: dict[str, Hit] = {}
        self._counters = _counters(registry) if registry is not None else []

    @classmethod
    def build(
        cls,
        settings: PrefixSettings,
        caches: Sequence[RaggedKVCache],
        needs_hidden: bool,
        registry: Any | None = None,
        kv_cache_memory_bytes: int | None = None,
    ) -> PrefixHits | None:
        """The prefix cache of ``caches``, or ``None`` when off. Its default budget is
        ``DEFAULT_REQUESTS`` full-length requests' KV, at most ``kv_cache_memory_bytes`` when that bounds
        the slots (so a bounded engine at most doubles), and never below one block."""
        if not settings.enabled:
            return None
        if settings.memory_bytes is not None:
            budget = settings.memory_bytes
        else:
            per_position = sum(c.layout.bytes_per_position for c in caches)
            budget = DEFAULT_REQUESTS * per_position * max(c.max_len for c in caches)
            budget = min(budget, kv_cache_memory_bytes or budget)
            budget = max(budget, settings.block_size * per_position)
        return cls(PrefixCache(caches, settings.block_size, budget, needs_hidden), registry)

    def admit(self, slot: int, request: Request) -> None:
        """Look ``request``'s prompt up and load the hit into its (new, empty) slot."""
        hit = NO_HIT
        if request.params.prompt_logprobs is None:
            hit = self.cache.lookup(request.prompt_token_ids, request.cache_salt)
            self.cache.load(slot, hit)
            for queries, hits in self._counters:
                queries.inc(len(request.prompt_token_ids))
                hits.inc(hit.length)
        request.num_cached_tokens = hit.length
        self._hits[request.request_id] = hit

    def forget(self, request_id: str) -> None:
        self._hits.pop(request_id, None)

    def drafter_view(
        self, start: int, requests: Sequence[Request], batch: StepBatch, target: TargetOutput
    ) -> tuple[StepBatch, TargetOutput]:
        """The prefill step as the drafter sees it: every prompt row (module docstring)."""
        hits = [self._hits.get(r.request_id, NO_HIT) for r in requests]
        if not any(h.length for h in hits):
            return batch, target
        lens = [len(r.prompt_token_ids) for r in requests]
        tokens = torch.zeros((len(requests), max(lens)), dtype=torch.int64)  # [B, P]
        for b, request in enumerate(requests):
            tokens[b, : lens[b]] = torch.tensor(request.prompt_token_ids, dtype=torch.int64)
        full = build_step_batch(start, tokens.to(batch.input_ids.device), lens, [0] * len(requests))
        loc = batch.query_start_loc_host
        hidden: dict[str, torch.Tensor | None] = {}
        for which in ("final", "aux"):
            rows = getattr(target, which)
            if rows is None:
                hidden[which] = None
                continue
            parts = []
            for b, hit in enumerate(hits):
                stored = hit.hidden(which)
                if hit.length and stored is None:
                    raise RuntimeError(
                        f"prefix cache entries lack the {which} hidden states the drafter reads"
                    )
                parts += [p for p in (stored, _rows(rows, loc, b)) if p is not None and len(p)]
            hidden[which] = torch.cat([p.to(rows.device, rows.dtype) for p in parts])  # [sum(lens), ...]
        return full, TargetOutput(target.logits, hidden["final"], hidden["aux"])

    def remember(
        self, start: int, requests: Sequence[Request], batch: StepBatch, target: TargetOutput
    ) -> None:
        """Store the prefilled prompts' whole blocks (``batch``/``target``: the prefill's own rows)."""
        loc = batch.query_start_loc_host
        for b, request in enumerate(requests):
            hit = self._hits.pop(request.request_id, NO_HIT)
            if request.finish_reason == "error":
                continue
            self.cache.store(
                start + b,
                request.prompt_token_ids,
                hit,
                _rows(target.final, loc, b),
                _rows(target.aux, loc, b),
                request.cache_salt,
            )


__all__ = ["DEFAULT_BLOCK_SIZE", "PrefixHits", "PrefixSettings"]
