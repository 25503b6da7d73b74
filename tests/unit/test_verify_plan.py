"""``VerifyPlan``: a verification rule with its parameters, resolved once from the config and passed down
as one value (``LLM`` -> ``Verifier`` -> ``RejectionSampler``)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import fixed_ngram, one_thread  # noqa: F401 - one_thread is an autouse fixture

from spec_backend.backends.reference import ReferenceBackend
from spec_backend.config import RejectionSamplerConfig, SpeculativeConfig, VerifyPlan
from spec_backend.config.fly import FlyConfig
from spec_backend.engine.verify import Verifier
from spec_backend.sampling import RejectionSampler
from spec_backend.verify_rules import rule_named

NGRAM = fixed_ngram(4, 3)


def spec(**kw: object) -> SpeculativeConfig:
    return SpeculativeConfig.model_validate({**NGRAM, **kw})


def test_resolve_carries_each_rule_with_its_own_parameters() -> None:
    synthetic = VerifyPlan.resolve(spec(rejection_sample_method="synthetic", synthetic_acceptance_length=3.0))
    assert (synthetic.rule.name, synthetic.fly) == ("synthetic", None)
    assert synthetic.rates is not None and len(synthetic.rates) == 4
    assert 1 + sum(synthetic.rates) == pytest.approx(3.0)
    fly = VerifyPlan.resolve(spec(rejection_sample_method="fly", fly_entropy_threshold=0.5))
    assert (fly.rule.name, fly.rates, fly.fly) == ("fly", None, FlyConfig(3, 0.5, 3))
    block = VerifyPlan.resolve(spec(rejection_sample_method="block"), RejectionSamplerConfig())
    assert (block.rule.name, block.config.enable_block_verify, block.rates, block.fly) == (
        "block-lossless",
        True,
        None,
        None,
    )
    entropy = RejectionSamplerConfig(enable_entropy_verify=True, posterior_alpha=0.7)
    plan = VerifyPlan.resolve(spec(rejection_sample_method="probabilistic"), entropy)
    assert (plan.rule.name, plan.config.posterior_alpha) == ("entropy", 0.7)
    assert VerifyPlan.resolve(None, entropy) == VerifyPlan(rule_named("entropy"), entropy)
    assert VerifyPlan.resolve(None) == VerifyPlan.of() == VerifyPlan(rule_named("standard"))


def test_resolve_refuses_flags_the_method_cannot_take() -> None:
    with pytest.raises(ValueError, match=r"'fly' has its own acceptance rule .*enable_block_verify=True"):
        VerifyPlan.resolve(
            spec(rejection_sample_method="fly"), RejectionSamplerConfig(enable_block_verify=True)
        )


def test_a_plan_refuses_parameters_its_rule_does_not_read() -> None:
    with pytest.raises(ValueError, match=r"synthetic_acceptance_rates is only used with method='synthetic'"):
        VerifyPlan(rule_named("standard"), rates=(0.5,))
    with pytest.raises(ValueError, match=r"method='fly' needs fly=FlyConfig.*method='standard'"):
        VerifyPlan(rule_named("standard"), fly=FlyConfig(2))
    with pytest.raises(ValueError, match=r"method='fly' needs fly=FlyConfig"):
        VerifyPlan(rule_named("fly"))
    with pytest.raises(ValueError, match=r"needs synthetic_acceptance_rates"):
        VerifyPlan(rule_named("synthetic"))
    with pytest.raises(
        ValueError, match=r"rule='block-lossless'\) does not match its config, which selects 'standard'"
    ):
        VerifyPlan(rule_named("block-lossless"))
    with pytest.raises(
        ValueError, match=r"unknown rejection sampler method 'typical'; allowed: standard, synthetic, fly"
    ):
        VerifyPlan.of(method="typical")
    assert VerifyPlan.of(method="synthetic", rates=[1, 0.5]).rates == (1.0, 0.5)  # floats, in a tuple


def test_the_sampler_runs_the_plan_it_is_given() -> None:
    plan = VerifyPlan.of(method="synthetic", rates=[0.9, 0.4])
    sampler = RejectionSampler(plan=plan)
    assert (sampler.plan, sampler.rule, sampler.method, sampler.mode_name) == (
        plan,
        plan.rule,
        "synthetic",
        "synthetic",
    )
    assert sampler._rates is not None and sampler._rates.tolist() == [0.9, 0.4]
    fly = RejectionSampler(plan=VerifyPlan.of(method="fly", fly=FlyConfig(2)))
    assert (fly.fly, fly.config) == (FlyConfig(2), RejectionSamplerConfig())
    keywords = RejectionSampler(RejectionSamplerConfig(enable_block_verify=True))  # the keyword form
    assert keywords.plan == VerifyPlan.of(RejectionSamplerConfig(enable_block_verify=True))


def test_the_sampler_refuses_rule_arguments_beside_a_plan() -> None:
    plan = VerifyPlan.of()
    with pytest.raises(ValueError, match=r"from the plan; got config, synthetic_acceptance_rates beside it"):
        RejectionSampler(RejectionSamplerConfig(), synthetic_acceptance_rates=[0.5], plan=plan)
    with pytest.raises(ValueError, match=r"from the plan; got method beside it"):
        RejectionSampler(method="fly", plan=plan)
    with pytest.raises(ValueError, match=r"from the plan; got fly beside it"):
        RejectionSampler(fly=FlyConfig(2), plan=plan)


def test_the_verifier_hands_its_plan_to_the_sampler() -> None:
    plan = VerifyPlan.of(method="fly", fly=FlyConfig(2, 0.1, 2))
    verifier = Verifier(ReferenceBackend(), plan)
    assert verifier.plan is plan and verifier.sampler.plan is plan
    assert verifier.sampler.backend_name == ReferenceBackend().name


def test_llm_builds_one_plan_from_its_configs(tmp_path_factory: pytest.TempPathFactory) -> None:
    from spec_backend.engine import LLM
    from spec_backend.tools.tiny import make_tiny_model

    model = make_tiny_model(tmp_path_factory.mktemp("llama"), "llama")
    config = {
        **NGRAM,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [1, 0.5, 0.5, 0.1],
    }
    additional = {"rejection_sampler_config": {"posterior_threshold": 0.5}}
    llm = LLM(model, speculative_config=config, additional_config=additional)
    plan = llm.engine.verifier.sampler.plan
    assert plan == VerifyPlan.of(
        RejectionSamplerConfig(posterior_threshold=0.5), "synthetic", [1, 0.5, 0.5, 0.1]
    )
    plain = LLM(model, additional_config={"rejection_sampler_config": {"enable_block_verify": True}})
    assert plain.engine.verifier.sampler.plan.rule is rule_named("block-lossless")
