"""Sampled siblings for static token trees (#42): under probabilistic drafting (a
``rejection_sample_method`` that reads draft probabilities), a sampled request's children of a node are
drawn from the drafter's distribution instead of being its top tokens, and verified by recursive
rejection sampling with the distributions they were drawn from (``verify_rules.TREE_REGISTRY``'s
``rrs``; ``sampling.tree_ops``).

Glossary:

* *draw* — a node's children, drawn from ``q`` (the drafter's distribution after the node's path, under
  the request's temperature) **without replacement, in order**: the exponential race's keys
  ``q_v / E_v`` (``E_v = -log u_v``) sorted, largest first — the first is a draw from ``q``, each next one
  a draw from ``q`` without the earlier ones (a Plackett–Luce draw). The noise is counter-based: keyed by
  the request's seed, the position of the step's first draft (it grows every step, so no noise is reused)
  and the parent's index (``rng.STREAM_DRAFT``).
* *sibling distribution* — what child ``r`` (the ``r``-th draw) was drawn from given the earlier draws:
  ``q`` without the ``r`` earlier tokens, renormalised (all zeros when they held all of ``q``'s mass);
  ``draft_probs [B, n, V]`` carries it for every node. Draws a static tree does not keep (a rank skipped)
  still count as earlier draws: the distribution is conditional on every draw before it, which is what
  the rule needs.

The shape is fixed before any draw (a static tree), so which siblings exist never depends on their
tokens; EAGLE-2's dynamic trees keep nodes by their draft probability and would bias that, so they are
refused with sampled siblings (``engine.assembly``). Greedy requests keep the top tokens (one-hot rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spec_backend.proposers.contract import DraftOutput, DraftRequest
from spec_backend.sampling import rng
from spec_backend.sampling.probs import target_probs


class SampledSiblings:
    """The children drawn for one static tree step of a batch, and their distributions (module
    docstring)."""

    def __init__(self, requests: Sequence[DraftRequest]) -> None:
        self.requests = requests
        self.drawn: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # parent -> (q [B, V], tokens [B, k])
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None  # temperatures [B], noise keys [B]

    def _per_request(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each request's temperature and the step's noise key, built once for the step's parents."""
        if self._rows is None:
            self._rows = draft_noise(self.requests, device)
        return self._rows

    def children(self, parent: int, logits: torch.Tensor, need: int) -> torch.Tensor:  # [B, V] -> [B, need]
        """The first ``need`` children of ``parent``: draws for the sampled requests, the top tokens for
        the greedy ones."""
        temps, step_key = self._per_request(logits.device)  # [B], [B]
        off_k, off_p = torch.zeros_like(temps, dtype=torch.int64), torch.ones_like(temps)
        q = target_probs(logits, temps, off_k, off_p, apply_top_k=False, apply_top_p=False)  # [B, V]
        key = rng.absorb(step_key, parent + 1)[:, None]  # [B, 1]
        buf = torch.empty(q.shape, dtype=torch.int64, device=q.device)  # [B, V]
        uniform = rng.vocab_uniform_f32_into(key, 0, buf, torch.empty_like(buf))  # [B, V] in (0, 1)
        drawn = torch.topk(q / uniform.log().neg(), need, dim=-1).indices  # [B, need] in draw order
        top = torch.topk(logits, need, dim=-1).indices  # [B, need]
        tokens = torch.where((temps <= 0)[:, None], top, drawn)
        self.drawn[parent] = (q, tokens)
        return tokens

    def probs(self, parents: Sequence[int], ranks: Sequence[int]) -> torch.Tensor:  # [B, n, V]
        """Each node's sibling distribution (module docstring); one-hot rows for greedy requests."""
        rows = []
        for parent, rank in zip(parents, ranks, strict=True):
            q, tokens = self.drawn[parent]
            greedy = self._per_request(q.device)[0] <= 0  # [B]
            rest = q.scatter(1, tokens[:, :rank], 0.0) if rank else q  # [B, V]
            total = rest.sum(dim=-1, keepdim=True)  # [B, 1]
            rest = torch.where(total > 0, rest / total.clamp_min(torch.finfo(rest.dtype).tiny), rest)
            point = torch.nn.functional.one_hot(tokens[:, rank], q.shape[-1]).to(q.dtype)  # [B, V]
            rows.append(torch.where(greedy[:, None], point, rest))
        return torch.stack(rows, dim=1)


def draft_noise(requests: Sequence[DraftRequest], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's temperature ``[B]`` and its drafting step's noise key ``[B]`` (its seed and the
    position of the step's first draft, stream ``rng.STREAM_DRAFT``)."""
    temps = torch.tensor([float(r.temperature) for r in requests], dtype=torch.float32).to(device)
    seeds = torch.tensor([r.seed for r in requests], dtype=torch.int64).to(device)  # [B]
    first = torch.tensor([r.num_tokens for r in requests], dtype=torch.int64).to(device)  # [B]
    return temps, rng.row_key(seeds, first, rng.STREAM_DRAFT)


def sampled_siblings(requests: Sequence[DraftRequest], probabilistic: bool) -> SampledSiblings | None:
    """The siblings' sampler of a probabilistic drafter's step (``None``: every node a top token)."""
    if not probabilistic or all(r.temperature <= 0 for r in requests):
        return None
    return SampledSiblings(requests)


def static_tree_output(
    tokens: torch.Tensor,  # [B, n]
    parents: Sequence[int],
    ranks: Sequence[int],
    siblings: SampledSiblings | None,
) -> DraftOutput:
    """A static tree's drafts for every request, with the sibling distributions when they were drawn."""
    probs = siblings.probs(parents, ranks) if siblings is not None else None  # [B, n, V]
    return DraftOutput(tokens, (len(parents),) * tokens.shape[0], draft_probs=probs)


__all__ = ["SampledSiblings", "draft_noise", "sampled_siblings", "static_tree_output"]
