"""Monte-Carlo through the PUBLIC sampler: ties the float64 spec to a backend's implementation.

Each group of requests draws its draft blocks exactly from the case's drafter (numpy, fixed seed), gets
its own distinct RNG seed per request, and the whole batch (several groups, shuffled together, variable
K) goes through ONE ``sampler(...)`` call. The emitted sequences are then compared with an exact law by
Pearson's χ² test.

Noise floor: cells whose expected count is below 5 are pooled into one cell; a test fails when its χ²
p-value is below ``P_FLOOR = 1e-5``. Fixed seeds make every run deterministic; a full run makes ~130
such tests, so the chance that a correct sampler's fixed seeds land below the floor somewhere is ~1e-3.
Any observed outcome of exact probability 0 fails outright. For reference the empirical TV is also
reported: for N samples over M outcomes its expectation under the null is below ½·sqrt(M/N) (≈ 0.065
for M = 340, N = 20000; observed 0.005-0.05), while the lossy modes deviate by TV 0.1-0.8 on the
detection cases.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from spec_backend.sampling import PLACEHOLDER_TOKEN_ID, SamplingMetadata, SpecDecodeMetadata
from spec_backend.testing.exact import Case, Prefix, SeqDist

P_FLOOR = 1e-5
_IMPOSSIBLE = 1e-15


@dataclass(frozen=True)
class Group:
    """``size`` requests of one case inside a Monte-Carlo batch."""

    case: Case
    size: int


@dataclass(frozen=True)
class ChiSquare:
    """Result of one goodness-of-fit test."""

    statistic: float
    dof: int
    p_value: float
    tv: float
    impossible: int  # observations of exact-probability-0 outcomes
    samples: int

    @property
    def passed(self) -> bool:
        return self.impossible == 0 and self.p_value >= P_FLOOR

    def __str__(self) -> str:
        return (
            f"chi2={self.statistic:.1f} dof={self.dof} p={self.p_value:.3g} TV={self.tv:.4f} "
            f"N={self.samples} impossible={self.impossible}"
        )


def chi_square(counts: Counter[Prefix], law: SeqDist) -> ChiSquare:
    """Pearson χ² of observed ``counts`` against the exact ``law`` (cells with expectation < 5 pooled)."""
    total = sum(counts.values())
    impossible = sum(n for key, n in counts.items() if law.get(key, 0.0) <= _IMPOSSIBLE)
    stat, dof, pooled_obs, pooled_exp = 0.0, -1, 0.0, 0.0
    for key, prob in law.items():
        expected, observed = total * prob, float(counts.get(key, 0))
        if expected < 5.0:
            pooled_obs, pooled_exp = pooled_obs + observed, pooled_exp + expected
            continue
        stat += (observed - expected) ** 2 / expected
        dof += 1
    if pooled_exp > 0.0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        dof += 1
    dof = max(dof, 1)
    p_value = float(
        torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0))
    )
    keys = set(counts) | set(law)
    tv = 0.5 * sum(abs(counts.get(k, 0) / total - law.get(k, 0.0)) for k in keys)
    return ChiSquare(stat, dof, p_value, tv, impossible, total)


def continue_counts(counts: Counter[Prefix], case: Case, length: int, seed: int) -> Counter[Prefix]:
    """Continue each observed sequence with the target (multinomial splits) to ``length`` tokens, then cut."""
    rng = np.random.default_rng(seed)
    out: Counter[Prefix] = Counter()
    stack = sorted(counts.items())
    while stack:
        seq, n = stack.pop()
        if len(seq) >= length:
            out[seq[:length]] += n
            continue
        for token, m in enumerate(rng.multinomial(n, case.target(seq))):
            if m:
                stack.append(((*seq, token), int(m)))
    return out


def _block_table(case: Case) -> tuple[list[Prefix], np.ndarray[Any, Any]]:
    blocks = list(case.blocks())
    probs = np.array([p for _, p in blocks], dtype=np.float64)
    return [b for b, _ in blocks], probs / probs.sum()


def _emitted(row: list[int]) -> Prefix:
    """Tokens before the first placeholder; a malformed row (token after padding) maps to ``(-2,)``."""
    n = row.index(PLACEHOLDER_TOKEN_ID) if PLACEHOLDER_TOKEN_ID in row else len(row)
    if any(t != PLACEHOLDER_TOKEN_ID for t in row[n:]):
        return (-2,)
    return tuple(row[:n])


def run_groups(
    sampler: Any,
    groups: Sequence[Group],
    *,
    seed: int,
    device: torch.device | str = "cpu",
    draft_probs: bool | None = None,
) -> list[Counter[Prefix]]:
    """Run all ``groups`` in ONE shuffled batch through ``sampler``; per group, counts of emitted sequences.

    ``draft_probs=None`` decides automatically: ``None`` is passed only when every group is a point-mass
    case without ``onehot_probs``; otherwise point masses are passed as one-hot rows.
    """
    rng = np.random.default_rng(seed)
    vocab = groups[0].case.vocab_size
    if any(g.case.vocab_size != vocab for g in groups):
        raise ValueError("all groups of one Monte-Carlo batch need the same vocabulary size")
    if draft_probs is None:
        draft_probs = not all(g.case.point_mass and not g.case.onehot_probs for g in groups)
    requests: list[tuple[int, Prefix]] = []
    for gi, group in enumerate(groups):
        blocks, probs = _block_table(group.case)
        requests.extend((gi, blocks[j]) for j in rng.choice(len(blocks), size=group.size, p=probs))
    order = rng.permutation(len(requests))
    requests = [requests[i] for i in order]
    logits_rows: list[np.ndarray[Any, Any]] = []
    q_rows: list[np.ndarray[Any, Any]] = []
    cache: dict[tuple[int, Prefix], tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
    for gi, drafts in requests:
        entry = cache.get((gi, drafts))
        if entry is None:
            case = groups[gi].case
            lg = np.stack([case.logits(drafts[:i]) for i in range(case.k + 1)])  # [K+1, V]
            qs = (
                np.stack([case.draft_dist(drafts[:i]) for i in range(case.k)])
                if case.k
                else np.zeros((0, vocab))
            )
            entry = cache[(gi, drafts)] = (lg, qs)
        logits_rows.append(entry[0])
        q_rows.append(entry[1])
    dev = torch.device(device)
    logits = torch.from_numpy(np.concatenate(logits_rows)).to(torch.float32).to(dev)  # [T+B, V]
    q = torch.from_numpy(np.concatenate(q_rows)).to(torch.float32).to(dev) if draft_probs else None  # [T, V]
    metadata = SpecDecodeMetadata.from_draft_tokens([list(d) for _, d in requests], device=dev)
    cases = [groups[gi].case for gi, _ in requests]
    base_seed = int(rng.integers(0, 2**40))
    sampling = SamplingMetadata.from_lists(
        [c.temperature for c in cases],
        top_k=[c.top_k for c in cases],
        top_p=[1.0] * len(cases),
        seeds=[base_seed + n for n in range(len(cases))],
        positions=[int(x) for x in rng.integers(0, 2**20, size=len(cases))],
        device=dev,
    )
    out = sampler(metadata, q, logits, sampling).cpu().tolist()  # [B, max_K+1]
    counts: list[Counter[Prefix]] = [Counter() for _ in groups]
    for (gi, _), row in zip(requests, out, strict=True):
        counts[gi][_emitted(row)] += 1
    return counts


__all__ = ["P_FLOOR", "ChiSquare", "Group", "chi_square", "continue_counts", "run_groups"]
