"""The one registry of verification rules (``spec_backend.verify_rules``): its entries against hard-coded
expectations, its selector, its kernels, and its agreement with every reader (sampler, config, the
conformance suite, the float64 spec), with a negative control for the agreement check."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from typing import Any, get_args

import pytest
import torch

from spec_backend.config.rejection import RejectionSamplerConfig as Config
from spec_backend.config.speculative import SpeculativeConfig
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata
from spec_backend.sampling.torch_ops import TorchSamplerOps
from spec_backend.testing import conformance, spec
from spec_backend.testing.exact_checks import VERIFY_RULES as EXACT_RULES
from spec_backend.verify_rules import REGISTRY, ModeName, SamplerMethod, rule_named, select_rule

#: written out by hand: name -> (has a float64 spec, lossless, SamplerOps method that verifies the drafts)
EXPECTED = {
    "standard": (True, True, "standard_verify"),
    "block-lossless": (True, True, "block_verify"),
    "block-cumulative": (True, False, "cumulative_verify"),
    "entropy": (True, False, "standard_verify"),
    "block-lossless+entropy": (True, False, "block_verify"),
    "block-cumulative+entropy": (True, False, "cumulative_verify"),
    "synthetic": (True, False, None),
    "fly": (False, False, "standard_verify"),
}


def test_entries_match_the_hand_written_table() -> None:
    assert [r.name for r in REGISTRY] == list(EXPECTED)
    assert {r.name: (r.spec, r.lossless) for r in REGISTRY} == {
        name: (has_spec, lossless) for name, (has_spec, lossless, _) in EXPECTED.items()
    }
    assert set(get_args(ModeName)) == set(EXPECTED)
    assert {r.method for r in REGISTRY} == set(get_args(SamplerMethod))  # every method has a rule


def test_each_rule_has_one_name_everywhere() -> None:
    """The spec, the exact tier and the conformance suite name a rule as the sampler does."""
    with_spec = tuple(name for name, (has_spec, _, _) in EXPECTED.items() if has_spec)
    assert spec.RULES == conformance.MODES == with_spec
    assert tuple(n for n in with_spec if EXPECTED[n][2] is not None) == EXACT_RULES
    for old in ("block", "cumulative", "block+entropy", "cumulative+entropy"):  # the spec's former names
        with pytest.raises(ValueError, match=f"unknown rule '{re.escape(old)}'"):
            spec.spec_entry(old)


class _Recorder:
    """Stands in for ``SamplerOps``: records which verify method a kernel selector calls."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def method(*args: Any) -> Any:
            self.called.append(name)
            return (torch.zeros(1), torch.ones(1)) if name == "block_verify" else torch.zeros(1)

        return method


@pytest.mark.parametrize("rule", REGISTRY, ids=lambda r: r.name)
def test_kernel_selectors_call_the_expected_ops_method(rule: Any) -> None:
    want = EXPECTED[rule.name][2]
    if want is None:
        assert rule.kernel is None
        return
    ops = _Recorder()
    accepted, weight = rule.kernel(ops)(*range(8))
    assert ops.called == [want] and accepted.shape == (1,)
    assert (weight is not None) == (want == "block_verify")  # only block verification returns b_τ
    short = _Recorder()
    rule.kernel_for(2)(short)(*range(8))  # K < 3: the cumulative rules take the token-level kernel
    assert short.called == ["standard_verify" if rule.block == "cumulative" else want]


FLAGS = list(itertools.product([False, True], ["lossless", "cumulative"], [False, True]))


@pytest.mark.parametrize(("block", "mode", "entropy"), FLAGS)
@pytest.mark.parametrize("method", get_args(SamplerMethod))
def test_selector_picks_exactly_one_rule_or_refuses(
    block: bool, mode: str, entropy: bool, method: str
) -> None:
    config = Config(enable_block_verify=block, block_verify_mode=mode, enable_entropy_verify=entropy)  # type: ignore[arg-type]
    matches = [r.name for r in REGISTRY if r.selects(config, method)]
    if method != "standard" and (block or entropy):
        assert matches == []
        with pytest.raises(ValueError, match=rf"method='{method}' cannot be combined with enable_block"):
            select_rule(config, method)
        return
    assert len(matches) == 1
    name = matches[0]
    base = f"block-{mode}" if block else "standard"
    by_flags = base if not entropy else ("entropy" if not block else f"{base}+entropy")
    assert name == (by_flags if method == "standard" else method)
    assert select_rule(config, method).name == name


def test_selector_errors_name_the_value() -> None:
    with pytest.raises(
        ValueError, match=r"unknown rejection sampler method 'typical'; allowed: fly, standard"
    ):
        select_rule(Config(), "typical")
    with pytest.raises(ValueError, match=r"unknown verification rule 'greedy'; known: \['standard'"):
        rule_named("greedy")
    with pytest.raises(
        ValueError, match=r"unknown rule 'fly'; expected one of \('standard', 'block-lossless'"
    ):
        spec.spec_entry("fly")  # FLy has no float64 spec


@pytest.mark.parametrize("rule", REGISTRY, ids=lambda r: r.name)
def test_config_flags_round_trip_and_every_reader_agrees(rule: Any) -> None:
    config = Config(**rule.config_flags())
    assert select_rule(config, rule.method) is rule
    kwargs: dict[str, Any] = {}
    if rule.method == "synthetic":
        kwargs["synthetic_acceptance_rates"] = [0.5]
    if rule.method == "fly":
        from spec_backend.config.fly import FlyConfig

        kwargs["fly"] = FlyConfig(2)
    sampler = RejectionSampler(config, method=rule.method, **kwargs)
    assert (sampler.mode_name, sampler.lossless, sampler.rule) == (rule.name, rule.lossless, rule)
    if rule.method == "standard":
        assert config.lossless is rule.lossless


def disagreements(
    modes: Iterable[str],
    spec_rules: Iterable[str],
    lossless_rules: Iterable[str],
    exact_rules: Iterable[str],
) -> list[str]:
    """Where the given vocabularies differ from the registry (empty: they agree)."""
    checked = [r for r in REGISTRY if r.spec]
    want: dict[str, tuple[object, object]] = {
        "modes": (tuple(modes), tuple(r.name for r in checked)),
        "spec rules": (tuple(spec_rules), tuple(r.name for r in checked)),
        "lossless rules": (set(lossless_rules), {r.name for r in checked if r.lossless}),
        "exact rules": (tuple(exact_rules), tuple(r.name for r in checked if r.kernel is not None)),
    }
    return [f"{what}: {got} != {expected}" for what, (got, expected) in want.items() if got != expected]


def test_conformance_suite_and_spec_agree_with_the_registry() -> None:
    args = (
        conformance.MODES,
        spec.RULES,
        spec.LOSSLESS_RULES,
        EXACT_RULES,
    )
    assert disagreements(*args) == []
    for mode in conformance.MODES:  # the suite builds each mode's sampler, and its label is the registry's
        sampler = conformance.build_sampler(mode)
        assert sampler.mode_name == mode and sampler.lossless is rule_named(mode).lossless
        assert conformance.rule_of(sampler) == mode


def test_agreement_check_has_teeth() -> None:
    """Negative control: each vocabulary, tampered with once, is reported."""
    good: list[Any] = [
        list(conformance.MODES),
        list(spec.RULES),
        set(spec.LOSSLESS_RULES),
        list(EXACT_RULES),
    ]
    tampered: list[list[Any]] = [
        [good[0][:-1], *good[1:]],  # a mode dropped
        [good[0], [*good[1], "greedy"], *good[2:]],  # a spec rule the registry does not have
        [*good[:2], good[2] | {"block-cumulative"}, good[3]],  # a lossy rule labelled lossless
        [*good[:3], list(reversed(good[3]))],  # the exact tier's order differs
    ]
    for n, args in enumerate(tampered):
        problems = disagreements(*args)
        assert len(problems) == 1, (n, problems)


def test_spec_dispatch_follows_the_registry_flags() -> None:
    """block_step picks each law from the registry's flags: e.g. the entropy rule with θ = 1, α = 0 equals
    the standard rule, and an unknown rule names the known ones."""
    p = torch.softmax(torch.randn(3, 5, generator=torch.Generator().manual_seed(0)), -1).double().numpy()
    q = torch.softmax(torch.randn(2, 5, generator=torch.Generator().manual_seed(1)), -1).double().numpy()
    neutral = spec.RuleParams(theta=1.0, alpha=0.0)
    std = spec.block_step("standard", p, q, (1, 3), neutral)
    ent = spec.block_step("entropy", p, q, (1, 3), neutral)
    assert abs(std.accept_probs - ent.accept_probs).max() < 1e-12
    blk = spec.block_step("block-lossless", p, q, (1, 3), neutral)
    assert abs(blk.accept_probs - spec.block_outcome(p, q, (1, 3)).accept_probs).max() == 0.0
    with pytest.raises(ValueError, match=r"unknown rule 'greedy'"):
        spec.block_step("greedy", p, q, (1, 3), neutral)


class _CountingOps(TorchSamplerOps):
    """The torch ops, counting the verify kernels the sampler calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def standard_verify(self, *args: Any) -> torch.Tensor:
        self.calls.append("standard_verify")
        return super().standard_verify(*args)

    def cumulative_verify(self, *args: Any) -> torch.Tensor:
        self.calls.append("cumulative_verify")
        return super().cumulative_verify(*args)

    def block_verify(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append("block_verify")
        return super().block_verify(*args)


class _OpsBackend:
    """A duck-typed ``SamplerBackend`` (not a ``Backend`` subclass)."""

    name = "counting"

    def __init__(self, ops: TorchSamplerOps) -> None:
        self.ops = ops

    def sampler_ops(self) -> TorchSamplerOps:
        return self.ops

    def sampler_tuning(self) -> Any:
        from spec_backend.sampling.tuning import SamplerTuning

        return SamplerTuning()

    def token_limits(self) -> Any:
        from spec_backend.backends.base import TokenLimits

        return TokenLimits()


@pytest.mark.parametrize("name", [n for n, (_, _, m) in EXPECTED.items() if m and n != "fly"])
@pytest.mark.parametrize("k", [2, 3])
def test_sampler_runs_the_registry_kernel(name: str, k: int) -> None:
    rule = rule_named(name)
    ops = _CountingOps()
    sampler = RejectionSampler(Config(**rule.config_flags()), backend=_OpsBackend(ops))
    md = SpecDecodeMetadata.from_draft_tokens([[1] * k, [2]])
    logits = torch.randn(md.num_tokens + 2, 6)
    sampler(md, None, logits, SamplingMetadata.random(2, seed=3))
    want = EXPECTED[name][2]
    assert ops.calls == ["standard_verify" if rule.block == "cumulative" and k < 3 else want]


def test_effective_config_of_block_method_is_the_block_lossless_rule() -> None:
    from spec_backend.config import effective_rejection_sampler_config

    spec_cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=3, rejection_sample_method="block")
    rs = effective_rejection_sampler_config(spec_cfg)
    assert select_rule(rs).name == "block-lossless" and rs.lossless
