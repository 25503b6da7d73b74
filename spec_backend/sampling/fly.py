"""FLy verification (vLLM 0.33's ``rejection_sample_method="fly"``, arXiv 2511.22972): **lossy**.

FLy runs before the native rules and only turns some rejections into acceptances; the native rules
then run unchanged. Glossary, per request with n drafts and window W (``FlyConfig``):

* **native acceptance** of draft i: greedy requests ``x_i == argmax p_i``; sampled requests the
  standard rule ``u_i < ρ_i`` with the step's own uniforms.
* **rescue** of a draft i that is natively rejected, when all hold: the draft is a real token (not a
  placeholder); greedy: its raw target logit is finite; sampled: ``p_i(x_i) > 0`` and ``q_i(x_i) > 0``;
  a full window exists (``i + W < n``); the drafts ``i+1 .. i+W`` are all natively accepted (judged on
  the unmodified values, so rescues never chain through a window); and the target's top-k entropy at i,
  ``H = −Σ_{top-k} p·ln p`` over the processed target probabilities (greedy rows: the raw softmax), is
  at least the threshold.
* **effect**: a rescued greedy draft counts as the argmax; a rescued sampled draft gets ``u_i = 0``, so
  the native rule accepts it (vLLM's own mechanism). Recovered and bonus tokens are sampled exactly as in
  ``standard``.

Everything here is device tensors over the batch's drafts ([T]) and their padded layout ([B, S]); the
only vocabulary-sized work is one top-k over the draft rows.
"""

from __future__ import annotations

import torch

from spec_backend.config.fly import FlyConfig
from spec_backend.sampling.torch_ops import draft_p_q, draft_ratios, padded, request_layout


def top_k_entropy(probs: torch.Tensor, top_k: int) -> torch.Tensor:  # [R, V] -> [R] float32
    """``−Σ p·ln p`` over each row's ``top_k`` largest probabilities (not renormalised; 0·ln 0 = 0)."""
    top = torch.topk(probs.to(torch.float32), k=min(top_k, probs.shape[-1]), dim=-1).values  # [R, k]
    terms = torch.where(top > 0, top * torch.log(top), torch.zeros_like(top))
    return -terms.sum(dim=-1)


def window_accepted(
    native: torch.Tensor,  # [T] bool
    cu_num_draft_tokens: torch.Tensor,  # [B]
    max_spec_len: int,
    window: int,
    req_of: torch.Tensor,  # [T] int64
    slot_of: torch.Tensor,  # [T] int64
) -> torch.Tensor:  # [T] bool
    """For each draft i: a full window follows (i + W < n) and drafts i+1..i+W are all natively accepted."""
    index, valid, num = request_layout(cu_num_draft_tokens, max_spec_len)  # [B, S], [B, S], [B]
    accepted = padded(native, index, valid, False).to(torch.int64)  # [B, S]
    counts = torch.nn.functional.pad(torch.cumsum(accepted, dim=1), (1, 0))  # [B, S+1] accepted before j
    slots = torch.arange(max_spec_len, device=num.device)  # [S]
    end = torch.clamp(slots + 1 + window, max=max_spec_len)  # [S]
    in_window = counts[:, end] - counts[:, slots + 1]  # [B, S]
    full = (slots[None, :] + window < num[:, None]) & (in_window == window)  # [B, S]
    return full[req_of, slot_of]


def fly_rescues(
    fly: FlyConfig,
    draft_ids: torch.Tensor,  # [T] int, -1 = null draft
    draft_probs: torch.Tensor | None,  # [T, V]
    logits: torch.Tensor,  # [N, V] raw target logits
    probs: torch.Tensor | None,  # [N, V] processed target probabilities (None: every request greedy)
    target_rows: torch.Tensor,  # [T] int64
    greedy: torch.Tensor,  # [T] bool, draft of a greedy request
    target_argmax: torch.Tensor | None,  # [T] argmax of each draft's target row (None: none greedy)
    uniforms: torch.Tensor | None,  # [T] float64 acceptance uniforms (None: every request greedy)
    layout: tuple[torch.Tensor, int, torch.Tensor, torch.Tensor],  # cu [B], max_spec_len, req_of, slot_of
) -> torch.Tensor:  # [T] bool: natively rejected drafts that FLy accepts
    """The drafts FLy rescues (see the module docstring)."""
    ids = draft_ids.to(torch.int64)
    real, safe = ids >= 0, ids.clamp(min=0)  # [T]
    native = torch.zeros_like(real)
    eligible = torch.zeros_like(real)
    entropy = torch.zeros(ids.shape[0], dtype=torch.float32, device=ids.device)  # [T]
    if target_argmax is not None:
        raw = logits[target_rows, safe]  # [T]
        native = torch.where(greedy, ids == target_argmax.to(torch.int64), native)
        eligible = torch.where(greedy, raw > float("-inf"), eligible)
        entropy = torch.where(
            greedy, top_k_entropy(torch.softmax(logits[target_rows].float(), -1), fly.entropy_top_k), entropy
        )
    if probs is not None and uniforms is not None:
        rho = draft_ratios(draft_ids, draft_probs, probs, target_rows)  # [T] 0 for null drafts
        p_x, q_x = draft_p_q(draft_ids, draft_probs, probs, target_rows)  # [T], [T]
        native = torch.where(greedy, native, uniforms < rho)
        eligible = torch.where(greedy, eligible, (p_x > 0) & (q_x > 0))
        entropy = torch.where(greedy, entropy, top_k_entropy(probs[target_rows], fly.entropy_top_k))
    cu, max_spec_len, req_of, slot_of = layout
    window = window_accepted(native, cu, max_spec_len, fly.window_size, req_of, slot_of)
    return ~native & real & eligible & window & (entropy >= fly.entropy_threshold)


__all__ = ["fly_rescues", "top_k_entropy", "window_accepted"]
