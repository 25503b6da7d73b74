"""A decode step's outcome as the stepper hands it on: its batch and target outputs, and the emitted
tokens, on the device until read (``StepResult.read``: the step's one device-to-host copy); and a plain
step launched ahead of the host (``Launched``, ``lookahead.py``).

Glossary: *packed* — per request its emitted tokens (placeholders after them), then its verified draft
count, one ``[B, W + 1]`` device tensor (``Verifier.launch``, ``CapturedVerify.launch``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from spec_backend.step import StepBatch, TargetOutput, build_step_batch, unpack_emitted

if TYPE_CHECKING:
    from spec_backend.engine.request import Request


@dataclass(frozen=True)
class StepResult:
    batch: StepBatch
    target: TargetOutput
    emitted: list[list[int]]  # per request: accepted drafts, then the recovered or bonus token
    drafted: list[int]  # per request: drafts verified (those before its first placeholder)
    #: [B, W + 1] on the device: per request its emitted tokens (placeholders after them), then its
    #: verified drafts (``Verifier.launch``); None for a tree step (its lists are read already)
    packed: torch.Tensor | None = None
    unread: bool = False  # ``emitted`` and ``drafted`` wait for ``read``
    #: [B] int64 on the device: each request's RNG counter in this step (its tokens before the step);
    #: a speculative step launched after it counts on from here (``spec_ahead.py``)
    counters: torch.Tensor | None = None
    #: [B] int64 on the device: each request's first query token in this step (its newest token before)
    fed: torch.Tensor | None = None
    #: waits for ``packed``'s copy to the host, started when the step was launched
    #: (``Backend.start_host_copy``); None: the copy is made by ``read``
    host: Callable[[], torch.Tensor] | None = None

    def read(self) -> StepResult:
        """The emitted tokens and counts on the host: the step's one device-to-host copy."""
        if not self.unread:
            return self
        assert self.packed is not None
        rows = (self.host() if self.host is not None else self.packed).tolist()
        emitted, drafted = unpack_emitted(rows)
        return replace(self, emitted=emitted, drafted=drafted, unread=False, host=None)


@dataclass(frozen=True)
class Launched:
    """A step launched ahead (``lookahead.py``): its requests in their slot order at launch, and its
    result, read or not; ``speculative``: a verify step whose successor drafts from its device output
    (``spec_ahead.py``), else a plain one."""

    requests: list[Request]
    result: StepResult
    speculative: bool = False

    def read(self) -> Launched:
        """This step with its tokens on the host (``StepResult.read``)."""
        return replace(self, result=self.result.read())

    def copying(self, start: Callable[[torch.Tensor], Callable[[], torch.Tensor]]) -> Launched:
        """This step with its packed output's copy to the host started (``start``:
        ``Backend.start_host_copy``), right after the step was queued."""
        result = self.result
        if not result.unread or result.packed is None:
            return self
        return replace(self, result=replace(result, host=start(result.packed)))

    def next_tokens(self, requests: list[Request]) -> torch.Tensor:  # [B, 1] int64
        """The query tokens of the step after this one, for ``requests`` (each one of this step's): each
        one's emitted token, gathered on the device (no host read)."""
        packed = self.result.packed
        assert packed is not None
        tokens = packed[:, :1].to(torch.int64)  # [B_launched, 1]
        index = moved_rows(self.requests, requests)
        if index is None:
            return tokens  # the same slots: no copy from the host
        rows = torch.tensor(index, dtype=torch.int64)  # [B]
        return tokens[rows.to(tokens.device)]


def moved_rows(before: Sequence[Request], now: Sequence[Request]) -> list[int] | None:
    """Each of ``now``'s requests' row in ``before`` (requests left since, so the slots moved); ``None``
    where ``now`` is ``before``, request for request."""
    if len(now) == len(before) and all(a is b for a, b in zip(now, before, strict=True)):
        return None
    at = {id(r): i for i, r in enumerate(before)}
    return [at[id(r)] for r in now]


def one_token_rows(result: StepResult, index: Sequence[int], lengths: Sequence[int]) -> StepResult:
    """A one-token step's result for its requests at ``index`` (``lengths``: the cache's host lengths, this
    step's position included): ``request_rows``."""
    return request_rows(result, index, [lengths[i] - 1 for i in range(len(index))])


def request_rows(result: StepResult, index: Sequence[int], cached: Sequence[int]) -> StepResult:
    """A step's result, ``q`` query rows per request (a captured step's layout), for its requests at
    ``index``, as a step of those requests alone would hold it: they fill the slots ``0 ..`` now
    (``cached``: each one's cached positions before the step), the batch is rebuilt over their tokens (a
    step launched ahead holds placeholders there) and the target's rows (logits and hidden states, ``q``
    each) are theirs."""
    batch, target = result.batch, result.target
    q = batch.query_lens_host[0] if batch.query_lens_host else 1
    if any(n != q for n in batch.query_lens_host):
        raise ValueError(f"a step's rows by request need q rows each, got {list(batch.query_lens_host)}")
    device = batch.input_ids.device
    requests = torch.tensor(list(index), dtype=torch.int64).to(device)  # [b]
    rows = (requests[:, None] * q + torch.arange(q, device=device)).reshape(-1)  # [b * q]
    tokens = batch.input_ids.reshape(-1)[rows].view(len(index), q)  # [b, q]
    picked = TargetOutput(
        logits=target.logits[rows],  # [b * q, V]
        final=target.final[rows] if target.final is not None else None,  # [b * q, H]
        aux=target.aux[rows] if target.aux is not None else None,  # [b * q, n_aux, H]
    )
    return StepResult(
        batch=build_step_batch(0, tokens, [q] * len(index), list(cached), [q - 1] * len(index)),
        target=picked,
        emitted=[result.emitted[i] for i in index],
        drafted=[result.drafted[i] for i in index],
    )


__all__ = ["Launched", "StepResult", "moved_rows", "one_token_rows", "request_rows"]
