"""Exact (float64 enumeration) checks of the verification RULES themselves — backend independent.

* lossless rules (``standard``, ``block-lossless``): TV between the continued emitted stream and the target
  below ``EXACT_TOL = 1e-9`` on every case, for every prefix length 1..K+1;
* lossy rules: TV above ``LOSSY_MIN = 1e-3`` on the detection cases (the issue's example, the paper's
  example, a context-dependent case, a tempered/top-k case);
* Sun et al.'s toy example: 10/9 vs 11/9 expected accepted drafts per step;
* the issue's numbers: the first emitted token is the argmax 50% of the time for the lossless rules,
  ~76% (block-cumulative, K = 3) and ~79% (entropy, θ = 0.95, α = 0.4);
* block-lossless ≥ standard in expected accepted drafts on random (p, q); equal for point-mass drafts;
* a self-test of the cumulative rule's quadrature against its closed form for K = 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache, partial

import numpy as np

from spec_backend.testing.cases import (
    all_cases,
    context_cases,
    issue_case,
    paper_case,
    random_pair_cases,
    random_point_mass_cases,
    tempered_case,
)
from spec_backend.testing.exact import Case, deviation, emitted_distribution, expected_accepted
from spec_backend.testing.report import CheckResult
from spec_backend.testing.spec import LOSSLESS_RULES, cumulative_accept_probs
from spec_backend.verify_rules import CUMULATIVE_MIN_SPEC_LEN, REGISTRY

EXACT_TOL = 1e-9
LOSSY_MIN = 1e-3
#: the rules the exact tier enumerates: every registry rule with a spec that verifies drafts against the
#: target (synthetic has no losslessness claim to test)
VERIFY_RULES: tuple[str, ...] = tuple(r.name for r in REGISTRY if r.spec and r.kernel is not None)


@cache
def _cases() -> tuple[Case, ...]:
    return tuple(all_cases())


def detection_cases(rule: str | None = None) -> list[Case]:
    """Cases on which every lossy rule must show a deviation above ``LOSSY_MIN``.

    vllm-ascend's cumulative rules run only on blocks of K >= 3 (shorter batches take its token-level
    rule, lossless without entropy verify), so ``block-cumulative`` is detected on those cases
    only.
    """
    cases = [issue_case(), paper_case(), context_cases()[0], tempered_case()]
    if rule == "block-cumulative":
        return [c for c in cases if c.k >= CUMULATIVE_MIN_SPEC_LEN]
    return cases


def deviations(case: Case, rule: str) -> list[float]:
    """TV to the target of the continued stream's first L tokens, L = 1..K+1."""
    return [deviation(case, rule, length) for length in range(1, case.k + 2)]


def check_exact_lossless(rule: str) -> CheckResult:
    """A lossless rule's continued output equals the target law on every case (TV < 1e-9)."""
    worst, where = 0.0, ""
    for case in _cases():
        tv = max(deviations(case, rule))
        if tv > worst:
            worst, where = tv, case.name
    passed = worst < EXACT_TOL
    return CheckResult(
        f"exact/lossless[{rule}]", passed, f"max TV {worst:.2e} (case {where or '-'}), tol {EXACT_TOL}"
    )


def check_exact_lossy(rule: str) -> CheckResult:
    """A lossy rule must deviate from the target on every detection case (TV > 1e-3)."""
    tvs = {case.name: deviation(case, rule) for case in detection_cases(rule)}
    passed = min(tvs.values()) > LOSSY_MIN
    detail = ", ".join(f"{name}: TV {tv:.4f}" for name, tv in tvs.items())
    return CheckResult(f"exact/lossy_detected[{rule}]", passed, detail)


def check_paper_example() -> CheckResult:
    """Sun et al. 2024's toy example: E[accepted] = 10/9 (standard) and 11/9 (block-lossless)."""
    case = paper_case()
    std, blk = expected_accepted(case, "standard"), expected_accepted(case, "block-lossless")
    passed = abs(std - 10 / 9) < 1e-12 and abs(blk - 11 / 9) < 1e-12
    return CheckResult("exact/paper_example", passed, f"standard {std * 9:.12f}/9, block {blk * 9:.12f}/9")


def argmax_first_rate(rule: str, k: int = 3) -> float:
    """P(first emitted token = argmax) on the issue's example."""
    return sum(m for seq, m in emitted_distribution(issue_case(k), rule).items() if seq[0] == 0)


def check_issue_example() -> CheckResult:
    """The issue's numbers: 50% for the lossless rules, ~76% block-cumulative, ~79% entropy (K = 3)."""
    rules = ("standard", "block-lossless", "block-cumulative", "entropy")
    rates = {rule: argmax_first_rate(rule) for rule in rules}
    passed = (
        abs(rates["standard"] - 0.5) < 1e-12
        and abs(rates["block-lossless"] - 0.5) < 1e-12
        and abs(rates["block-cumulative"] - 0.76) < 0.005
        and abs(rates["entropy"] - 0.79) < 0.005
    )
    return CheckResult("exact/issue_example", passed, ", ".join(f"{r}: {v:.4f}" for r, v in rates.items()))


def check_block_dominates(count: int = 60) -> CheckResult:
    """E[accepted] block-lossless ≥ standard on random (p, q); equal (to 1e-12) for point-mass drafters."""
    gains = [
        expected_accepted(c, "block-lossless") - expected_accepted(c, "standard")
        for c in random_pair_cases(count)
    ]
    flat = [
        abs(expected_accepted(c, "block-lossless") - expected_accepted(c, "standard"))
        for c in random_point_mass_cases(count // 2)
    ]
    passed = min(gains) > -1e-12 and max(flat) < 1e-12
    detail = (
        f"{count} random pairs: min gain {min(gains):.2e}, mean gain {float(np.mean(gains)):.4f}, "
        f"max gain {max(gains):.4f}; point mass: max |gain| {max(flat):.1e}"
    )
    return CheckResult("exact/block_dominates_standard", passed, detail)


def check_spec_selftest() -> CheckResult:
    """Quadrature of the cumulative rule vs its K = 2 closed form; block = standard for K = 1."""
    errors = []
    for c1, c2 in ((0.6, 0.2), (0.9, 0.05), (0.3, 0.29), (1.0, 0.5)):  # bounds π_i/t_i, c2 <= c1
        law = cumulative_accept_probs(np.array([c1, c2]))
        want2 = c2 * (1.0 - math.log(c2))  # P(u1·u2 < c2)
        want1 = (c1 - c2) - c2 * math.log(c1 / c2)  # P(u1 < c1, u1·u2 > c2)
        errors.append(max(abs(law[2] - want2), abs(law[1] - want1), abs(law.sum() - 1.0)))
    for case in context_cases():
        if case.k == 1:
            a, b = emitted_distribution(case, "standard"), emitted_distribution(case, "block-lossless")
            errors.append(max(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b)))
    worst = max(errors)
    return CheckResult("exact/spec_selftest", worst < 1e-12, f"max error {worst:.1e}")


def exact_check_list() -> list[tuple[str, Callable[[], CheckResult]]]:
    """(name, thunk) of every exact-tier check, for lazy pytest parametrisation."""
    out: list[tuple[str, Callable[[], CheckResult]]] = [
        ("spec_selftest", check_spec_selftest),
        ("paper_example", check_paper_example),
        ("issue_example", check_issue_example),
        ("block_dominates_standard", check_block_dominates),
    ]
    for rule in VERIFY_RULES:
        if rule in LOSSLESS_RULES:
            out.append((f"lossless[{rule}]", partial(check_exact_lossless, rule)))
        else:
            out.append((f"lossy_detected[{rule}]", partial(check_exact_lossy, rule)))
    return out


def exact_checks() -> list[CheckResult]:
    """Run every exact-tier check."""
    return [thunk() for _, thunk in exact_check_list()]


def deviation_table() -> list[dict[str, object]]:
    """Rows (case, rule, TV first token, TV first K+1 tokens, E[tokens per step]) for the docs."""
    rows: list[dict[str, object]] = []
    for case in _cases():
        for rule in VERIFY_RULES:
            tvs = deviations(case, rule)
            rows.append(
                {
                    "case": case.name,
                    "rule": rule,
                    "tv_first": tvs[0],
                    "tv_all": tvs[-1],
                    "tokens_per_step": 1.0 + expected_accepted(case, rule),
                }
            )
    return rows


__all__ = [
    "EXACT_TOL",
    "LOSSY_MIN",
    "VERIFY_RULES",
    "argmax_first_rate",
    "check_block_dominates",
    "check_exact_lossless",
    "check_exact_lossy",
    "check_issue_example",
    "check_paper_example",
    "check_spec_selftest",
    "detection_cases",
    "deviation_table",
    "deviations",
    "exact_check_list",
    "exact_checks",
]
