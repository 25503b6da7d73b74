"""Target distributions: temperature, top-k, top-p; and the entropy thresholds of entropy verify.

Order of operations (as in vLLM): divide the logits by the temperature, keep the top-k logits (every
logit equal to the k-th largest is kept), renormalise, keep the smallest prefix of the descending
(stably sorted) probabilities whose mass reaches top_p (at least one token), renormalise. Greedy rows
(temperature 0) get temperature 1 here so that nothing divides by zero; the sampler takes their tokens
from the argmax of the raw logits instead. Draft probabilities are never processed here: callers pass
them already processed (the drafter applies the request's temperature / top-k / top-p itself).
"""

from __future__ import annotations

import torch


def target_probs(
    logits: torch.Tensor,  # [N, V] any float dtype
    temperature: torch.Tensor,  # [N] float
    top_k: torch.Tensor,  # [N] int, 0 or >= V: off
    top_p: torch.Tensor,  # [N] float in (0, 1]
    apply_top_k: bool = True,
    apply_top_p: bool = True,
) -> torch.Tensor:  # [N, V] float32
    """Processed target probabilities; ``apply_top_*=False`` skips the sort when no row needs it."""
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(torch.float32)
    scaled = logits.to(torch.float32) / temp[:, None]  # [N, V]
    if not (apply_top_k or apply_top_p):
        return torch.softmax(scaled, dim=-1)
    vocab = scaled.shape[1]
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)  # [N, V]
    keep_sorted = torch.ones_like(sorted_logits, dtype=torch.bool)  # [N, V]
    if apply_top_k:
        k = top_k.to(torch.int64)
        k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)  # [N]
        kth = sorted_logits.gather(1, (k - 1)[:, None])  # [N, 1]
        keep_sorted &= sorted_logits >= kth
    if apply_top_p:
        masked = sorted_logits.masked_fill(~keep_sorted, float("-inf"))
        probs_sorted = torch.softmax(masked, dim=-1)  # [N, V]
        mass_before = torch.cumsum(probs_sorted, dim=-1) - probs_sorted  # [N, V] exclusive prefix mass
        keep_p = mass_before < top_p.to(torch.float32)[:, None]
        keep_p[:, 0] = True
        keep_sorted &= keep_p
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)  # [N, V] back to vocab order
    return torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)


#: vllm-ascend's ε inside the logarithm of entropy verify: H = −Σ p·ln(p + ε)
ENTROPY_EPSILON = 1e-10


def raw_entropy(logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N] float64
    """Entropy verify's H = −Σ_v p(v)·ln(p(v) + 1e−10), p = softmax of the raw logits (before temperature /
    top-k / top-p), in nats: vllm-ascend's formula, ε included.

    Computed in float32 (as a kernel would, one row per program) and returned as float64.
    """
    p = torch.softmax(logits.to(torch.float32), dim=-1)  # [N, V]
    return -(p * torch.log(p + ENTROPY_EPSILON)).sum(dim=-1).to(torch.float64)


def entropy_thresholds(
    logits: torch.Tensor,  # [N, V] raw target logits
    alpha: float,
    threshold: float,
) -> torch.Tensor:  # [N] float64
    """Entropy verify thresholds τ = min(exp(−α·H(p)), θ)."""
    return torch.clamp(torch.exp(-alpha * raw_entropy(logits)), max=threshold)


__all__ = ["ENTROPY_EPSILON", "entropy_thresholds", "raw_entropy", "target_probs"]
