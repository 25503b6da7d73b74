"""The conformance suite's named scenarios (small vocabularies so that exact enumeration is cheap)."""

from __future__ import annotations

from spec_backend.testing.exact import Case, ToyModel, greedy_of
from spec_backend.testing.spec import RuleParams

#: The issue's example: target p = [.5, .3, .15, .05] in every context, greedy (point-mass) draft.
ISSUE_PROBS = [0.5, 0.3, 0.15, 0.05]


def paper_case() -> Case:
    """Sun et al. 2024's toy example: V = {A, B}, K = 2, p = (1/3, 2/3), q = (2/3, 1/3) i.i.d.

    Expected accepted drafts per step: 10/9 (token verification) vs 11/9 (block verification).
    """
    return Case(
        "paper_toy_v2_k2",
        ToyModel(2, probs=[1.0, 2.0]),
        k=2,
        draft=ToyModel(2, probs=[2.0, 1.0]),
    )


def issue_case(k: int = 3, params: RuleParams | None = None) -> Case:
    """The issue's example (K = 3): the lossy modes emit the argmax ~76% (cumulative) / ~79% (entropy)."""
    target = ToyModel(4, probs=ISSUE_PROBS)
    return Case(f"issue_greedy_v4_k{k}", target, k=k, greedy=greedy_of(target), params=params or RuleParams())


def context_cases() -> list[Case]:
    """Context-dependent targets and drafters (p_{i+1} depends on the accepted prefix)."""
    t1 = ToyModel(4, seed=11, scale=1.5)
    d1 = ToyModel(4, base=t1, other=ToyModel(4, seed=12, scale=2.0), weight=0.6)
    t2 = ToyModel(5, seed=21, scale=1.2, zero_frac=0.3)
    d2 = ToyModel(5, seed=22, scale=1.2, zero_frac=0.3)
    t3 = ToyModel(4, seed=31, scale=2.5)
    d3 = ToyModel(4, base=t3, other=ToyModel(4, seed=32, scale=1.0), weight=0.3)
    t5, d5 = ToyModel(4, seed=1213, scale=1.0), ToyModel(4, seed=5213, scale=1.0)
    greedy_drafter = ToyModel(5, seed=42, scale=1.0)
    t4 = ToyModel(5, seed=41, scale=1.0, zero_frac=0.2)
    return [
        Case("context_v4_k3", t1, k=3, draft=d1),
        Case("context_zeros_v5_k2", t2, k=2, draft=d2),
        Case("context_sharp_v4_k1", t3, k=1, draft=d3),
        Case("context_greedy_v5_k3", t4, k=3, greedy=greedy_of(greedy_drafter)),
        Case("context_onehot_v5_k2", t4, k=2, greedy=greedy_of(greedy_drafter), onehot_probs=True),
        # chosen (seed search) so that block's b-weighted residual differs most from the token-level one
        Case("context_block_v4_k2", t5, k=2, draft=d5),
    ]


def tempered_case() -> Case:
    """Temperature 0.7 and top-k 3 applied by the sampler to the target logits; greedy point-mass drafts."""
    raw = ToyModel(4, seed=51, scale=1.2)
    drafter = ToyModel(4, base=raw, other=ToyModel(4, seed=52, scale=1.0), weight=0.5)
    target = ToyModel(4, base=raw, top_k=3)
    return Case(
        "tempered_topk_v4_k2", target, k=2, greedy=greedy_of(drafter), raw=raw, temperature=0.7, top_k=3
    )


def all_cases() -> list[Case]:
    """Every scenario of the exact tier."""
    return [paper_case(), issue_case(), *context_cases(), tempered_case()]


def random_pair_cases(count: int, seed: int = 1234) -> list[Case]:
    """Random (p, q) pairs for the "block ≥ standard" property (V ∈ {2..5}, K ∈ {1..3})."""
    out = []
    for n in range(count):
        vocab, k = 2 + n % 4, 1 + n % 3
        target = ToyModel(vocab, seed=seed + 2 * n, scale=0.5 + n % 5)
        draft = ToyModel(vocab, seed=seed + 2 * n + 1, scale=0.5 + (n * 7) % 4)
        out.append(Case(f"random_{n}", target, k=k, draft=draft))
    return out


def random_point_mass_cases(count: int, seed: int = 4321) -> list[Case]:
    """Random targets with point-mass drafters (block verification's gain must be exactly zero)."""
    out = []
    for n in range(count):
        vocab, k = 2 + n % 4, 1 + n % 3
        target = ToyModel(vocab, seed=seed + 2 * n, scale=0.5 + n % 5)
        drafter = ToyModel(vocab, seed=seed + 2 * n + 1)
        out.append(Case(f"random_point_mass_{n}", target, k=k, greedy=greedy_of(drafter)))
    return out


__all__ = [
    "ISSUE_PROBS",
    "all_cases",
    "context_cases",
    "issue_case",
    "paper_case",
    "random_pair_cases",
    "random_point_mass_cases",
    "tempered_case",
]
