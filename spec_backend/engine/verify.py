"""Token selection for the engine: every token goes through the ``RejectionSampler``.

Plain decoding is the K=0 case (only the bonus row), so greedy and sampling semantics are the same with
and without speculation. Sampling is counter-based: each request carries a seed, and the counter is the
absolute position of its first draft token, so a request's tokens do not depend on its batch mates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from spec_backend.backends.base import Backend
from spec_backend.config.verify_plan import VerifyPlan
from spec_backend.engine.logits import RowHistory, process_logits
from spec_backend.engine.request import Request
from spec_backend.engine.structured import constrain
from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata
from spec_backend.sampling.sampling_metadata import SamplingMetadata
from spec_backend.step import StepBatch


def batch_drafts(batch: StepBatch) -> list[list[int]]:
    """Each request's real drafts in ``batch`` (host lists; placeholders of a captured step dropped)."""
    flat: list[int] = batch.draft_token_ids.tolist()  # [T]
    out, at = [], 0
    for count in batch.num_draft_tokens:
        mine = flat[at : at + count]
        out.append(mine[: mine.index(PLACEHOLDER_TOKEN_ID)] if PLACEHOLDER_TOKEN_ID in mine else mine)
        at += count
    return out


class Verifier:
    """Wraps the rejection sampler: draft lists + logits in, per-request emitted tokens out (packed).

    ``plan``: the verification rule and its parameters, resolved once from the speculative config and
    ``additional_config`` (``VerifyPlan.resolve``).
    """

    def __init__(self, backend: Backend, plan: VerifyPlan) -> None:
        from spec_backend.sampling import RejectionSampler

        self.sampler = RejectionSampler(backend=backend, plan=plan)
        self.plan = plan

    def launch(
        self,
        batch: StepBatch,
        requests: Sequence[Request],
        logits: torch.Tensor,
        sampling: SamplingMetadata,
        draft_probs: torch.Tensor | None = None,
        last_only: bool = False,
        valid_drafts: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [B, max_K + 2] the sampler's integer dtype
        """Verify the drafts of ``batch`` (its ``SpecDecodeMetadata`` view) against ``logits``, the result
        left on the device (the caller reads it: the step's one device-to-host copy).

        ``logits``: ``[N, V]`` (every query row), or ``[B, V]`` with ``last_only`` (a prefill: no drafts).
        ``sampling``: the requests' parameters (``SamplingState.metadata``). ``draft_probs``: ``[T, V]`` the
        probabilities the drafts were sampled from (``None``: point masses). ``valid_drafts`` [B]: each
        request's drafts before its first placeholder (device; ``None``: no drafts).
        Returns per request its accepted drafts followed by the recovered or bonus token (placeholders
        after them), then its valid draft count (``step.unpack_emitted`` reads it).
        """
        metadata = batch.spec_decode_metadata(last_only)
        if any(r.params.processes_logits for r in requests):
            drafts = batch_drafts(batch)
            allowed = None
            if any(r.grammar is not None for r in requests):
                metadata, valid_drafts, allowed = _constrained(
                    batch, requests, metadata, drafts, valid_drafts, last_only, logits.shape[1]
                )
            logits = process_logits(
                logits,
                [r.params for r in requests],
                [r.prompt_token_ids for r in requests],
                [r.output_token_ids for r in requests],
                [r.min_tokens_stop_ids for r in requests],
                RowHistory.of(batch.query_lens_host, drafts, last_only),
                allowed,
            )
        out = self.sampler(metadata, draft_probs, logits, sampling)  # [B, max_K + 1] int32
        if valid_drafts is None:
            valid_drafts = torch.zeros(out.shape[0], dtype=out.dtype, device=out.device)  # [B]
        return torch.cat([out, valid_drafts.to(out.dtype)[:, None]], dim=1)


def _constrained(
    batch: StepBatch,
    requests: Sequence[Request],
    metadata: SpecDecodeMetadata,
    drafts: list[list[int]],
    valid_drafts: torch.Tensor | None,  # [B]
    last_only: bool,
    vocab: int,
) -> tuple[SpecDecodeMetadata, torch.Tensor | None, torch.Tensor]:
    """Structured outputs (``structured.py``): drafts a grammar forbids become placeholders (cut), and
    the ``[R, V]`` row masks the logits get."""
    grammars = [None if r.finished else r.grammar for r in requests]
    kept, allowed = constrain(grammars, drafts, batch.query_lens_host, last_only, vocab)
    if valid_drafts is None or all(k == len(d) for k, d in zip(kept, drafts, strict=True)):
        return metadata, valid_drafts, allowed
    ids = metadata.draft_token_ids.clone()  # [T]
    at = 0
    for count, k in zip(metadata.num_draft_tokens, kept, strict=True):
        ids[at + k : at + count] = PLACEHOLDER_TOKEN_ID
        at += count
    valid = torch.minimum(valid_drafts, torch.tensor(kept, dtype=valid_drafts.dtype).to(valid_drafts.device))
    return replace(metadata, draft_token_ids=ids), valid, allowed
