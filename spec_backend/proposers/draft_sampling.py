"""Choosing draft tokens from a drafter's logits: argmax, or sampled with the probabilities returned.

*Point-mass drafting* (``rejection_sample_method="strict"``, the default): drafts are the argmax and no
probabilities are passed, so the sampler treats each draft as ``q = 1`` at the draft. *Probabilistic
drafting* (any method that reads draft probabilities: ``probabilistic``, ``standard``, ``block``,
``fly``): requests with a temperature draw each draft from ``q`` = the drafter's distribution under the
request's temperature (counter-based noise keyed by the request's seed, the position of the block's first
draft and the draft's index in the block, ``rng.STREAM_DRAFT``), and ``q`` goes to the sampler, where
lossless block verification can gain over standard. Greedy requests draft the argmax with a one-hot ``q``.

The noise of a draft is never reused: a block's first position grows every step. Keying by the draft's
own position instead would redraw a rejected block's later positions with the noise block verification
already looked at (its decision depends on every draft of the block), which biases the output —
``tests/statistical/test_engine_draft_probs.py`` detects that.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spec_backend.proposers.contract import DraftOutput, DraftRequest
from spec_backend.sampling import rng
from spec_backend.sampling.probs import target_probs
from spec_backend.sampling.torch_ops import exponential_race


def select_drafts(
    logits: torch.Tensor,  # [B, V]
    requests: Sequence[DraftRequest],
    block_start: torch.Tensor,  # [B] int64 absolute position of the block's first draft
    index: int,  # this draft's index in the block (0-based)
    probabilistic: bool,
    top_k: torch.Tensor | None = None,  # [B] int64 (0: off)
    top_p: torch.Tensor | None = None,  # [B] float32 (1: off)
) -> tuple[torch.Tensor, torch.Tensor | None]:  # [B] int64, [B, V] float32 | None
    """One draft token per request, and its distribution when ``probabilistic`` (module docstring)."""
    greedy = logits.argmax(dim=-1)  # [B]
    if not probabilistic:
        return greedy, None
    device = logits.device
    temps = torch.tensor([float(r.temperature) for r in requests], dtype=torch.float32).to(device)  # [B]
    batch = logits.shape[0]
    k = top_k if top_k is not None else torch.zeros(batch, dtype=torch.int64, device=device)
    p = top_p if top_p is not None else torch.ones(batch, dtype=torch.float32, device=device)
    # [B, V]; the sort behind top-k / top-p only when asked for (a 49152-wide sort per draft cost ~1 ms)
    probs = target_probs(logits, temps, k, p, apply_top_k=top_k is not None, apply_top_p=top_p is not None)
    seeds = torch.tensor([r.seed for r in requests], dtype=torch.int64).to(device)  # [B]
    key = rng.absorb(rng.row_key(seeds, block_start, rng.STREAM_DRAFT), index)  # [B]
    sampled = exponential_race(probs, key[:, None])  # [B]
    is_greedy = temps <= 0  # [B]
    tokens = torch.where(is_greedy, greedy, sampled)
    one_hot = torch.nn.functional.one_hot(greedy, logits.shape[-1]).to(torch.float32)  # [B, V]
    return tokens, torch.where(is_greedy[:, None], one_hot, probs)


class DraftChain:
    """One step's drafts drawn position by position (``select_drafts``) and packed as a ``DraftOutput``.

    Every chain drafter (draft model, EAGLE, the heads) draws draft ``i`` from its logits ``[B, V]``
    with ``draw``; ``output`` stacks ids ``[B, K]`` and probabilities ``[B, K, V]`` and caps each count
    at the request's budget.
    """

    def __init__(self, requests: Sequence[DraftRequest], probabilistic: bool, device: torch.device) -> None:
        self.requests, self.probabilistic = requests, probabilistic
        self.block_start = torch.tensor([r.num_tokens for r in requests], dtype=torch.int64).to(device)  # [B]
        self.ids: list[torch.Tensor] = []  # each [B] int64
        self.probs: list[torch.Tensor] = []  # each [B, V] float32

    def draw(self, logits: torch.Tensor) -> torch.Tensor:  # [B, V] -> [B] int64
        """The next draft of every request."""
        ids, q = select_drafts(logits, self.requests, self.block_start, len(self.ids), self.probabilistic)
        self.ids.append(ids)
        if q is not None:
            self.probs.append(q)
        return ids

    def draw_greedy(self, logits: torch.Tensor, vocab: torch.Tensor | None) -> torch.Tensor:
        """The next draft of every request as the argmax of ``logits [B, Vd]`` over a vocabulary whose
        entries are the target ids ``vocab [Vd]`` (``None``: the target's): point-mass drafting only."""
        if self.probabilistic:
            raise ValueError("draw_greedy serves point-mass drafting; probabilistic drafts need draw()")
        ids = logits.argmax(dim=-1)  # [B]
        ids = ids if vocab is None else vocab[ids]
        self.ids.append(ids)
        return ids

    def extend(self, ids: torch.Tensor) -> None:
        """Point-mass drafts drawn elsewhere (a captured greedy chain), ``ids [B, n]``, after those drawn."""
        if self.probabilistic:
            raise ValueError("extend takes point-mass drafts; probabilistic drafts need draw()")
        self.ids.extend(ids.unbind(dim=1))

    def output(self, budgets: Sequence[int]) -> DraftOutput:
        k = len(self.ids)
        return DraftOutput(
            token_ids=torch.stack(self.ids, dim=1),  # [B, K]
            num_draft_tokens=tuple(min(b, k) for b in budgets),
            draft_probs=torch.stack(self.probs, dim=1) if self.probs else None,  # [B, K, V]
        )


__all__ = ["DraftChain", "select_drafts"]
