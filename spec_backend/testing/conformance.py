"""The public conformance suite: ``run_conformance(backend) -> ConformanceReport``.

Three tiers, all deterministic (fixed seeds):

1. **exact** (``exact_checks``): the float64 spec of each rule, enumerated on small vocabularies —
   lossless rules within 1e-9 TV of the target, lossy ones measurably off, the paper's and the issue's
   numbers, block ≥ standard.
2. **Monte-Carlo** (``check_monte_carlo``): the backend's sampler, through the public API, in one
   batched call per scenario group (variable K, shuffled, distinct seeds), must match the exact spec of
   its rule (χ² p ≥ 1e-5, no impossible outcome; see ``montecarlo``), AND its ``lossless`` label must
   match its measured behaviour (``check_lossless_label``): a sampler labelled lossless must have a
   lossless rule and its continued output must match the target law on every group; a sampler labelled
   lossy must be measurably lossy (some group with p < 1e-12 against the target).
3. **properties** (``properties``): greedy exactness, determinism, batch independence, layout, edges.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from spec_backend.config.rejection import RejectionSamplerConfig
from spec_backend.sampling import RejectionSampler
from spec_backend.testing.attention_checks import check_attention
from spec_backend.testing.cases import context_cases, issue_case, paper_case, tempered_case
from spec_backend.testing.exact import Case, Prefix, ToyModel, deviation, emitted_distribution, target_joint
from spec_backend.testing.exact_checks import EXACT_TOL, LOSSY_MIN, detection_cases, exact_checks
from spec_backend.testing.montecarlo import ChiSquare, Group, chi_square, continue_counts, run_groups
from spec_backend.testing.properties import PROPERTY_CHECKS
from spec_backend.testing.report import CheckResult, ConformanceReport
from spec_backend.testing.spec import LOSSLESS_RULES, RuleParams
from spec_backend.verify_rules import REGISTRY, VerifyRule, rule_named

#: p-value below which a labelled-lossy sampler counts as measurably lossy
LOSSY_EVIDENCE = 1e-12
#: synthetic acceptance rates used by the suite (entry i: P(first i+1 drafts accepted))
SYNTHETIC_RATES = (0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05)

#: the registry's rules that have a float64 spec: the modes the suite checks
CHECKED_RULES: tuple[VerifyRule, ...] = tuple(r for r in REGISTRY if r.spec)


def _mode_kwargs(rule: VerifyRule) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "config": RejectionSamplerConfig(**rule.config_flags()),
        "method": rule.method,
    }
    if rule.method == "synthetic":
        kwargs["synthetic_acceptance_rates"] = list(SYNTHETIC_RATES)
    return kwargs


#: mode_name -> RejectionSampler keyword arguments (backend added by ``build_sampler``)
MODE_KWARGS: dict[str, dict[str, Any]] = {r.name: _mode_kwargs(r) for r in CHECKED_RULES}
MODES = tuple(MODE_KWARGS)


def build_sampler(mode: str, backend: Any = None) -> RejectionSampler:
    """A ``RejectionSampler`` in ``mode`` (one of ``MODES``) on ``backend`` (None: the torch reference
    ops)."""
    return RejectionSampler(backend=backend, **MODE_KWARGS[mode])


def rule_of(sampler: Any) -> str:
    """The rule a sampler claims to implement: its ``mode_name``, which must have a float64 spec."""
    mode = str(sampler.mode_name)
    if mode not in MODES:
        raise ValueError(f"no spec for sampler mode {mode!r}; known: {sorted(MODES)}")
    return mode


def _compares_drafts(sampler: Any) -> bool:
    """False for a rule whose accept counts ignore the target (synthetic)."""
    return rule_named(str(sampler.mode_name)).kernel is not None


def params_of(sampler: Any) -> RuleParams:
    """θ, α from the sampler's config; synthetic rates from the sampler (``SYNTHETIC_RATES`` fallback)."""
    cfg = getattr(sampler, "config", None) or RejectionSamplerConfig()
    rates = getattr(sampler, "synthetic_acceptance_rates", None)
    if rates is None:
        rates = getattr(sampler, "_rates", None)
    rates = SYNTHETIC_RATES if rates is None else tuple(float(r) for r in torch.as_tensor(rates).tolist())
    return RuleParams(theta=cfg.posterior_threshold, alpha=cfg.posterior_alpha, rates=rates)


def _with_params(case: Case, params: RuleParams) -> Case:
    return Case(
        case.name,
        case.target,
        case.k,
        case.draft,
        case.greedy,
        case.onehot_probs,
        params,
        case.raw,
        case.temperature,
        case.top_k,
    )


def mc_batches(samples: int) -> list[list[Group]]:
    """The Monte-Carlo scenario groups; every inner list is ONE batched sampler call (same vocabulary)."""
    ctx = context_cases()
    bonus_only = Case("bonus_only_v4_k0", ToyModel(4, seed=61), k=0, greedy=lambda prefix: 0)
    return [
        [Group(issue_case(), samples), Group(tempered_case(), samples), Group(bonus_only, samples // 4)],
        [Group(ctx[0], samples), Group(ctx[2], samples // 2), Group(ctx[5], samples)],
        [Group(ctx[1], samples), Group(ctx[4], samples // 2), Group(ctx[3], samples // 2)],
        [Group(paper_case(), samples // 2)],
    ]


@dataclass
class MonteCarloResult:
    """Per group: the spec test and the target (continued-stream) test."""

    case: Case
    counts: Counter[Prefix]
    spec: ChiSquare
    target: ChiSquare


def monte_carlo(
    sampler: Any,
    *,
    rule: str | None = None,
    samples: int = 20000,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> list[MonteCarloResult]:
    """Run every scenario group through ``sampler`` and test it against ``rule``'s spec and the target."""
    rule = rule_of(sampler) if rule is None else rule
    params = params_of(sampler)
    results = []
    for n, batch in enumerate(mc_batches(samples)):
        in_batch = replace(params, batch_max_k=max(g.case.k for g in batch))
        groups = [Group(_with_params(g.case, in_batch), g.size) for g in batch]
        counts = run_groups(sampler, groups, seed=seed * 100 + n, device=device)
        for group, cnt in zip(groups, counts, strict=True):
            case, length = group.case, group.case.k + 1
            spec = chi_square(cnt, emitted_distribution(case, rule))
            target = chi_square(
                continue_counts(cnt, case, length, seed + 7), target_joint(case.target, length)
            )
            results.append(MonteCarloResult(case, cnt, spec, target))
    return results


def check_monte_carlo(
    sampler: Any, results: Sequence[MonteCarloResult], name: str, rule: str | None = None
) -> list[CheckResult]:
    """One check per group: the sampler's empirical output law matches its rule's exact law."""
    rule = rule_of(sampler) if rule is None else rule
    return [
        CheckResult(f"montecarlo/spec[{name}/{r.case.name}]", r.spec.passed, f"vs {rule} spec: {r.spec}")
        for r in results
    ]


def check_lossless_label(sampler: Any, results: Sequence[MonteCarloResult], name: str) -> list[CheckResult]:
    """``sampler.lossless`` must match both its rule's exact deviation and the measured deviation."""
    claimed = bool(sampler.lossless)
    rule = rule_of(sampler)
    out = []
    if not _compares_drafts(sampler):
        exact_ok, exact_detail = not claimed, "synthetic acceptance ignores the target"
    else:
        worst = max(deviation(_with_params(c, params_of(sampler)), rule) for c in detection_cases(rule))
        exact_ok = (worst < EXACT_TOL and rule in LOSSLESS_RULES) if claimed else worst > LOSSY_MIN
        exact_detail = f"rule {rule!r}: max exact TV {worst:.3g} on the detection cases"
    out.append(CheckResult(f"label/exact[{name}]", exact_ok, f"lossless={claimed}; {exact_detail}"))
    if claimed:
        out.extend(
            CheckResult(
                f"label/lossless_measured[{name}/{r.case.name}]",
                r.target.passed,
                f"continued output vs target: {r.target}",
            )
            for r in results
        )
    else:
        best = min(results, key=lambda r: r.target.p_value)
        out.append(
            CheckResult(
                f"label/lossy_measured[{name}]",
                best.target.p_value < LOSSY_EVIDENCE,
                f"lossless=False; strongest deviation from the target on {best.case.name}: {best.target}",
            )
        )
    return out


def check_sampler(
    sampler: Any,
    name: str | None = None,
    *,
    samples: int = 20000,
    seed: int = 0,
    device: torch.device | str = "cpu",
    properties: bool = True,
) -> list[CheckResult]:
    """Every sampler-level check (Monte-Carlo spec agreement, lossless label, properties) for one sampler."""
    name = name or str(sampler.mode_name)
    results = monte_carlo(sampler, samples=samples, seed=seed, device=device)
    out = check_monte_carlo(sampler, results, name) + check_lossless_label(sampler, results, name)
    if properties:
        out.extend(property_checks(sampler, name, device))
    return out


def property_checks(sampler: Any, name: str, device: torch.device | str = "cpu") -> list[CheckResult]:
    """The deterministic properties that apply to the sampler's mode (synthetic ignores the target)."""
    synthetic = not _compares_drafts(sampler)
    target_only = {"check_greedy_exact", "check_top_k_one_is_greedy", "check_edge_cases"}
    checks = [c for c in PROPERTY_CHECKS if not (synthetic and c.__name__ in target_only)]
    out = []
    for check in checks:
        try:
            out.append(check(sampler, device, name))
        except Exception as exc:  # a crash is a failed check
            out.append(CheckResult(f"properties/{check.__name__}[{name}]", False, f"raised {exc!r}"))
    return out


def run_conformance(
    backend: Any = None,
    *,
    modes: Iterable[str] = MODES,
    samples: int = 20000,
    seed: int = 0,
    exact: bool = True,
    attention_atol: float | None = 1e-4,
) -> ConformanceReport:
    """Run the whole suite against ``backend`` (a ``Backend``, a name, or None for ``load_backend()``).

    ``samples``: requests per main Monte-Carlo group (the noise floor is stated in ``montecarlo``).
    ``attention_atol``: the attention tier's noise floor (``attention_checks``; 2e-3 for an op that
    computes in float16); ``None`` skips that tier.
    """
    if backend is None or isinstance(backend, str):
        from spec_backend.backends import load_backend

        backend = load_backend(backend)
    report = ConformanceReport(str(getattr(backend, "name", backend)))
    if exact:
        for result in exact_checks():
            report.add(result)
    if attention_atol is not None:
        for result in check_attention(backend, atol=attention_atol):
            report.add(result)
    device = backend.device()
    for mode in modes:
        try:
            sampler = build_sampler(mode, backend)
            results = check_sampler(sampler, mode, samples=samples, seed=seed, device=device)
        except Exception as exc:
            results = [CheckResult(f"sampler[{mode}]", False, f"raised {type(exc).__name__}: {exc}")]
        for result in results:
            report.add(result)
    return report


__all__ = [
    "CHECKED_RULES",
    "LOSSY_EVIDENCE",
    "MODES",
    "MODE_KWARGS",
    "SYNTHETIC_RATES",
    "MonteCarloResult",
    "build_sampler",
    "check_lossless_label",
    "check_monte_carlo",
    "check_sampler",
    "mc_batches",
    "monte_carlo",
    "params_of",
    "property_checks",
    "rule_of",
    "run_conformance",
]
