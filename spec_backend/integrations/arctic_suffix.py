"""vLLM's ``method="suffix"`` without Arctic Inference: our suffix drafter behind Arctic's module name.

vLLM 0.32's ``SuffixDecodingProposer`` imports ``arctic_inference.suffix_decoding.SuffixDecodingCache``
(the C++ package ``arctic-inference``), and ``SpeculativeConfig`` refuses ``method="suffix"`` when that
package does not import. vLLM has no drafter plugin interface in 0.32, so the narrowest seam is the
module name it imports: when ``arctic_inference`` is not installed, ``install()`` registers a module of
that name whose ``SuffixDecodingCache`` is an adapter over ``spec_backend.proposers.SuffixProposer``.
An installed ``arctic_inference`` is never shadowed. Gated to the vLLM versions in ``SUPPORTED_VLLM``
(the plugin refuses others before this runs).

The adapter implements the part of Arctic's cache API that vLLM calls: ``start_request``,
``add_active_response``, ``stop_request``, ``evict_cached_response``, ``active_requests``,
``cached_requests`` and ``speculate`` (whose result carries ``token_ids`` only: the drafts are ours,
with our documented scoring, not Arctic's; probabilities and scores are not reported).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass, field

logger = logging.getLogger("spec_backend.integrations.vllm")

MODULE = "arctic_inference"
SUBMODULE = "arctic_inference.suffix_decoding"
_MARK = "__spec_backend_stand_in__"


@dataclass(frozen=True)
class SuffixDraft:
    """One request's draft (Arctic's ``SuffixDecodingDraft`` has more fields; vLLM reads this one)."""

    token_ids: list[int] = field(default_factory=list)


class SuffixDecodingCache:
    """Arctic's ``SuffixDecodingCache`` API over ``SuffixProposer`` (see the module docstring).

    ``max_cached_requests < 0`` means unlimited, as in Arctic; 0 disables the global response tree.
    """

    def __init__(self, max_tree_depth: int = 64, max_cached_requests: int = -1) -> None:
        from spec_backend.proposers.suffix import SuffixProposer

        self._proposer = SuffixProposer(
            num_speculative_tokens=max_tree_depth,  # an upper bound; speculate() caps each call
            max_tree_depth=max_tree_depth,
            max_cached_requests=max_cached_requests if max_cached_requests >= 0 else sys.maxsize,
        )
        logger.info(
            "spec_backend: vLLM's method='suffix' drafts with spec_backend's suffix drafter "
            "(arctic-inference is not installed; verification is unchanged)"
        )

    @property
    def active_requests(self) -> set[str]:
        return self._proposer.active_request_ids

    @property
    def cached_requests(self) -> set[str]:
        return self._proposer.cached_request_ids

    def start_request(self, req_id: str, prompt_token_ids: Sequence[int]) -> None:
        if req_id in self._proposer.active_request_ids:
            raise ValueError(f"suffix stand-in: request {req_id!r} is already active")
        self._proposer.add_request(req_id, [int(t) for t in prompt_token_ids])

    def add_active_response(self, req_id: str, token_ids: Sequence[int]) -> None:
        self._proposer.update(req_id, [int(t) for t in token_ids])

    def stop_request(self, req_id: str) -> None:
        """The request is done: its response joins the global tree (FIFO eviction)."""
        self._proposer.remove_request(req_id)

    def evict_cached_response(self, req_id: str) -> None:
        self._proposer.evict_cached_response(req_id)

    def speculate(
        self,
        req_id: str,
        context: Sequence[int],
        max_spec_tokens: int | None = None,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
    ) -> SuffixDraft:
        """Draft for ``req_id``. ``context`` (the request's last tokens) must end with the tokens this
        cache was given; a mismatch means the caller and the cache disagree and is refused."""
        proposer = self._proposer
        tail = [int(t) for t in context]
        known = proposer.response_tail(req_id, len(tail))
        if tail[len(tail) - len(known) :] != known:
            raise RuntimeError(
                f"suffix stand-in: context of request {req_id!r} ends with {tail[-len(known) :]}, but the "
                f"cache holds {known}: the engine and the suffix cache are out of step"
            )
        proposer.max_spec_factor, proposer.min_token_prob = float(max_spec_factor), float(min_token_prob)
        limit = proposer.max_tree_depth if max_spec_tokens is None else int(max_spec_tokens)
        return SuffixDraft(proposer.propose([req_id], [limit])[0])


def _module(name: str, package: bool) -> types.ModuleType:
    spec = importlib.machinery.ModuleSpec(name, None, is_package=package)
    module = importlib.util.module_from_spec(spec)
    setattr(module, _MARK, True)
    return module


def is_stand_in() -> bool:
    return bool(getattr(sys.modules.get(MODULE), _MARK, False))


def install() -> bool:
    """Register the stand-in when Arctic Inference is absent; returns whether it is (now) in place."""
    if is_stand_in():
        return True
    if MODULE in sys.modules or importlib.util.find_spec(MODULE) is not None:
        return False  # the real package (imported or installed): vLLM uses it
    parent, child = _module(MODULE, True), _module(SUBMODULE, False)
    child.SuffixDecodingCache = SuffixDecodingCache  # type: ignore[attr-defined]
    child.SuffixDecodingDraft = SuffixDraft  # type: ignore[attr-defined]
    parent.suffix_decoding = child  # type: ignore[attr-defined]
    sys.modules[MODULE], sys.modules[SUBMODULE] = parent, child
    logger.debug("spec_backend: vLLM's method='suffix' will use spec_backend's drafter (no arctic-inference)")
    return True


def uninstall() -> None:
    """Remove the stand-in (tests)."""
    if is_stand_in():
        del sys.modules[SUBMODULE], sys.modules[MODULE]
