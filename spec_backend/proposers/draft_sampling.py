"""Choosing draft tokens from a drafter's logits: argmax, or sampled with the probabilities returned.

*Point-mass drafting* (``rejection_sample_method="strict"``, the default): drafts are the argmax and no
probabilities are passed, so the sampler treats each draft as ``q = 1`` at the draft. *Probabilistic
drafting* (any method that reads draft probabilities: ``probabilistic``, ``standard``, ``block``,
``fly``): requests with a temperature draw each draft from ``q`` = the drafter's distribution under the
request's temperature / top-k / top-p (counter-based noise keyed by the request's seed and the draft's
absolute position, ``rng.STREAM_DRAFT``), and ``q`` goes to the sampler, where lossless block
verification can gain over standard. Greedy requests draft the argmax with a one-hot ``q``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spec_backend.proposers.contract import DraftRequest
from spec_backend.sampling import rng
from spec_backend.sampling.probs import target_probs
from spec_backend.sampling.torch_ops import exponential_race


def select_drafts(
    logits: torch.Tensor,  # [B, V]
    requests: Sequence[DraftRequest],
    positions: torch.Tensor,  # [B] int64 absolute position of each draft token
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
    probs = target_probs(logits, temps, k, p)  # [B, V]
    seeds = torch.tensor([r.seed for r in requests], dtype=torch.int64).to(device)  # [B]
    sampled = exponential_race(probs, rng.row_key(seeds, positions, rng.STREAM_DRAFT)[:, None])  # [B]
    is_greedy = temps <= 0  # [B]
    tokens = torch.where(is_greedy, greedy, sampled)
    one_hot = torch.nn.functional.one_hot(greedy, logits.shape[-1]).to(torch.float32)  # [B, V]
    return tokens, torch.where(is_greedy[:, None], one_hot, probs)


__all__ = ["select_drafts"]
