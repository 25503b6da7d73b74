"""Shadow drafts: what a host drafter would have drafted for a greedy request given no drafts, checked
against the tokens the request then emits — the acceptance adaptive drafting needs, without a verify step.

A greedy request's tokens are the target's argmax whatever is drafted, so drafts proposed and not verified
would have been accepted exactly up to their first token that differs from the tokens the request emits
next: a shadow of ``d`` drafts whose first ``m`` match counts as ``d`` drafted and ``m`` accepted, as a
verify step would have counted them (``Request.record_verification``). While adaptive drafting chooses
plain decoding, its acceptance estimates would otherwise stand still (nothing is verified) and a request
whose drafts started to pay (a code edit after chat) would wait for the next re-measurement to be seen.

Only drafters that draft on the host (``Drafter.can_shadow``: n-gram and suffix lookups) are asked: their
proposal costs a lookup, and ``Drafter.shadow`` gives the drafts as host lists without a device copy. A
request gets one shadow at a time, at most one every ``SHADOW_EVERY`` steps, so plain decoding keeps most
of the drafter's skipped proposals (``Drafter.follow``). A shadow that would have gained nothing (no
drafts found, or its first draft wrong) doubles the request's period, up to ``SHADOW_MAX`` steps, and one
that accepts a draft sets it back to ``SHADOW_EVERY``: on open chat, where lookups rarely pay, a request is
asked less and less often (each ask costs a lookup and a decision, ``AdaptiveDraftLength.hold``), and a
request whose drafts start to pay is seen within ``SHADOW_MAX`` steps.

Glossary: *shadow* — drafts proposed for a request whose budget was 0, kept aside (never verified) until the
request has emitted enough tokens to tell how many of them a verify step would have accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

#: steps from one shadow of a request to its next, at first and after a shadow that accepted a draft
SHADOW_EVERY = 4
#: the longest period between two shadows of a request (module docstring)
SHADOW_MAX = 16


class ShadowRequest(Protocol):
    """What a shadow reads of a request (the engine's ``Request`` satisfies it)."""

    request_id: str
    output_token_ids: list[int]

    @property
    def finished(self) -> bool: ...


@dataclass(frozen=True)
class _Shadow:
    start: int  # len(output_token_ids) when drafted: draft j guesses output token start + j
    drafts: tuple[int, ...]
    step: int  # the step that drafted it


@dataclass
class ShadowDrafts:
    """The open shadows of live requests and the counts of those resolved (module docstring)."""

    open: dict[str, _Shadow] = field(default_factory=dict)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (drafted, accepted), resolved
    last: dict[str, int] = field(default_factory=dict)  # id -> the step of its last shadow
    period: dict[str, int] = field(default_factory=dict)  # id -> steps from its last shadow to its next

    def due(self, request: ShadowRequest, step: int) -> bool:
        """Whether ``request`` may be shadowed at ``step``: none open, none in its period before."""
        due = self.due_step(request.request_id)
        return request.request_id not in self.open and (due is None or step >= due)

    def due_step(self, request_id: str) -> int | None:
        """The first step at which ``request_id`` may be shadowed once no shadow of it is open (``None``:
        never shadowed, at once)."""
        last = self.last.get(request_id)
        return None if last is None else last + self.period.get(request_id, SHADOW_EVERY)

    def _paid(self, request_id: str, paid: bool) -> None:
        """A shadow of ``request_id`` accepted a draft (``paid``) or would have gained nothing."""
        period = self.period.get(request_id, SHADOW_EVERY)
        self.period[request_id] = SHADOW_EVERY if paid else min(2 * period, SHADOW_MAX)

    def record(self, request: ShadowRequest, drafts: Sequence[int], step: int) -> None:
        """``drafts`` were proposed for ``request`` at ``step`` and not verified."""
        self.last[request.request_id] = step
        if drafts:
            start = len(request.output_token_ids)
            self.open[request.request_id] = _Shadow(start, tuple(int(t) for t in drafts), step)
        else:
            self._paid(request.request_id, False)

    def resolve(self, requests: Sequence[ShadowRequest]) -> tuple[int, int]:
        """Count the open shadows of ``requests`` that their tokens since decide: drafted and accepted,
        summed over those resolved now (each also added to its request's counts). A finished request's
        undecided shadow is dropped: its tokens stopped before they could tell."""
        drafted = accepted = 0
        for request in requests:
            shadow = self.open.get(request.request_id)
            if shadow is None:
                continue
            emitted = request.output_token_ids[shadow.start : shadow.start + len(shadow.drafts)]
            matched = next(
                (j for j, (d, t) in enumerate(zip(shadow.drafts, emitted, strict=False)) if d != t),
                len(emitted),
            )
            if matched == len(emitted) and len(emitted) < len(shadow.drafts):  # not decided yet
                if request.finished:
                    del self.open[request.request_id]
                continue
            del self.open[request.request_id]
            self._paid(request.request_id, matched > 0)
            old_drafted, old_accepted = self.counts.get(request.request_id, (0, 0))
            self.counts[request.request_id] = (old_drafted + len(shadow.drafts), old_accepted + matched)
            drafted, accepted = drafted + len(shadow.drafts), accepted + matched
        return drafted, accepted

    def counts_of(self, request_id: str) -> tuple[int, int]:
        """The drafted and accepted counts of ``request_id``'s resolved shadows."""
        return self.counts.get(request_id, (0, 0))

    def forget(self, request_id: str) -> None:
        """The request left."""
        self.open.pop(request_id, None)
        self.counts.pop(request_id, None)
        self.last.pop(request_id, None)
        self.period.pop(request_id, None)


__all__ = ["SHADOW_EVERY", "ShadowDrafts", "ShadowRequest"]
