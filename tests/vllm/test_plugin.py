"""The plugin as vLLM sees it: discovery, registration, version gate, additional_config handling."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from vllm_helpers import rsc, vllm_config, vllm_rejection_sampler

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def loaded() -> Any:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from spec_backend.integrations import vllm as plugin

    return plugin


def test_discovered_by_vllms_plugin_loader(loaded: Any) -> None:
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    from spec_backend.integrations.vllm import register

    plugins = load_plugins_by_group(group=DEFAULT_PLUGINS_GROUP)
    assert plugins.get("spec_backend") is register
    assert loaded.is_registered()


def test_hooks_installed_once(loaded: Any) -> None:
    import vllm.v1.sample.rejection_sampler as rsm
    from vllm.config import VllmConfig

    post_init, forward, fn = VllmConfig.__post_init__, rsm.RejectionSampler.forward, rsm.rejection_sample
    assert getattr(post_init, "_spec_backend_wrapped", False)
    assert getattr(fn, "_spec_backend_wrapped", False)
    loaded._registered = False  # a second call (another process, a re-import) must not wrap twice
    loaded.register()
    loaded.register()
    assert (VllmConfig.__post_init__, rsm.RejectionSampler.forward, rsm.rejection_sample) == (
        post_init,
        forward,
        fn,
    )


@pytest.mark.parametrize("version", ["0.32.0", "0.32.1", "0.33.0rc1", "0.33.4.dev12+gdeadbeef", "0.32.0+cpu"])
def test_supported_versions(version: str) -> None:
    from spec_backend.integrations.vllm import check_vllm_version

    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.9", "0.34.0", "1.0.0", "0.10.2", "not-a-version"])
def test_unsupported_versions_raise(version: str) -> None:
    from spec_backend.integrations.vllm import UnsupportedVllmVersionError, check_vllm_version

    with pytest.raises(UnsupportedVllmVersionError, match=r"vllm>=0\.32\.0,<0\.34"):
        check_vllm_version(version)


def test_register_raises_for_unsupported_vllm(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.31.0")
    monkeypatch.setattr(loaded, "_registered", False)
    with pytest.raises(loaded.UnsupportedVllmVersionError, match=r"vLLM 0\.31\.0 is not supported"):
        loaded.register()
    assert not loaded.is_registered()


def test_noop_without_rejection_sampler_config(loaded: Any) -> None:
    import os

    from spec_backend.integrations.vllm_sampler import active_verifier

    vllm_config({"some_other_plugin": {"x": 1}})
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
    assert active_verifier(vllm_rejection_sampler({"some_other_plugin": {"x": 1}})) is None
    assert active_verifier(vllm_rejection_sampler(None)) is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"posterior_threshold": 0}, r"posterior_threshold must be in \(0, 1\]"),
        ({"posterior_alpha": -0.5}, "posterior_alpha must be a finite number >= 0"),
        ({"block_verify_mode": "fast"}, "block_verify_mode"),
        ({"enable_block_verfy": True}, r"unknown rejection_sampler_config key\(s\) \['enable_block_verfy'\]"),
        ({"enable_block_verify": "yes"}, "enable_block_verify"),
    ],
)
def test_bad_config_fails_at_startup(loaded: Any, flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="spec_backend vLLM plugin: invalid additional_config") as info:
        vllm_config(rsc(**flags))
    assert info.match(message)


def test_bad_config_not_a_mapping(loaded: Any) -> None:
    with pytest.raises(ValueError, match="rejection_sampler_config must be a mapping"):
        vllm_config({"rejection_sampler_config": [True]})


@pytest.mark.parametrize(
    ("flags", "mode", "lossless"),
    [
        ({}, "standard", True),
        ({"enable_block_verify": True}, "block-lossless", True),
        ({"enable_block_verify": True, "block_verify_mode": "cumulative"}, "block-cumulative", False),
        ({"enable_entropy_verify": True, "posterior_alpha": 0.2}, "entropy", False),
    ],
)
def test_flags_select_our_sampler(loaded: Any, flags: dict[str, Any], mode: str, lossless: bool) -> None:
    from spec_backend.integrations.vllm_sampler import active_verifier

    verifier = active_verifier(vllm_rejection_sampler(rsc(**flags)))
    assert verifier is not None
    assert verifier.mode_name == mode
    assert verifier.sampler.lossless is lossless


def _spec(**fields: Any) -> Any:
    base = {"method": "eagle3", "num_speculative_tokens": 3, "rejection_sample_method": "standard"}
    return SimpleNamespace(**{**base, **fields})


def test_vllm_block_method_maps_to_lossless_block(loaded: Any) -> None:
    from spec_backend.integrations.vllm_sampler import active_verifier

    verifier = active_verifier(vllm_rejection_sampler(rsc(), _spec(rejection_sample_method="block")))
    assert verifier is not None and verifier.mode_name == "block-lossless"


def test_vllm_block_method_contradicts_cumulative(loaded: Any) -> None:
    cfg = rsc(enable_block_verify=True, block_verify_mode="cumulative")
    with pytest.raises(ValueError, match="block_verify_mode='cumulative'"):
        vllm_rejection_sampler(cfg, _spec(rejection_sample_method="block"))


def test_synthetic_runs_in_our_sampler_with_vllms_rates(loaded: Any) -> None:
    from spec_backend.integrations.vllm_sampler import active_verifier

    spec = _spec(rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.9, 0.5, 0.2])
    verifier = active_verifier(vllm_rejection_sampler(rsc(), spec))
    assert verifier is not None and verifier.mode_name == "synthetic"
    assert verifier.sampler.plan.rates == (0.9, 0.5, 0.2)
    with pytest.raises(ValueError, match="synthetic"):
        vllm_rejection_sampler(rsc(enable_block_verify=True), spec)


def _real_spec(rule: str) -> Any:
    """vLLM's own ``SpeculativeConfig`` (ngram, K=4) with ``rejection_sample_method=rule``."""
    from vllm.config import SpeculativeConfig

    extra: dict[str, Any] = (
        {"synthetic_acceptance_rates": [1.0, 1.0, 0.0, 0.0]} if rule == "synthetic" else {}
    )
    return SpeculativeConfig(
        method="ngram",
        num_speculative_tokens=4,
        prompt_lookup_max=4,
        prompt_lookup_min=2,
        rejection_sample_method=rule,
        **extra,
    )


def _installed_rules() -> list[str]:
    from typing import get_args

    from vllm.config.speculative import RejectionSampleMethod

    return list(get_args(RejectionSampleMethod))


def test_every_rule_the_installed_vllm_names_runs_in_our_sampler(loaded: Any) -> None:
    """Each ``rejection_sample_method`` the installed vLLM accepts (0.32: standard, synthetic, block;
    0.33 adds fly) builds our sampler with that rule and vLLM's parameters: none is swapped for another."""
    from spec_backend.config import RejectionSamplerConfig, VerifyPlan
    from spec_backend.config.fly import FlyConfig
    from spec_backend.integrations.vllm_sampler import active_verifier

    expected = {
        "standard": VerifyPlan.of(),
        "block": VerifyPlan.of(RejectionSamplerConfig(enable_block_verify=True)),
        "synthetic": VerifyPlan.of(method="synthetic", rates=[1.0, 1.0, 0.0, 0.0]),
        "fly": VerifyPlan.of(method="fly", fly=FlyConfig(3, 0.3, 3)),  # vLLM's window: min(6, K - 1)
    }
    rules = _installed_rules()
    assert {"standard", "synthetic", "block"} <= set(rules) <= set(expected), rules
    for rule in rules:
        spec = _real_spec(rule)
        vllm_config(rsc(), spec)  # the configuration hook accepts it
        verifier = active_verifier(vllm_rejection_sampler(rsc(), spec))
        assert verifier is not None and verifier.sampler.plan == expected[rule], rule


def test_backend_token_limits_enforced(loaded: Any) -> None:
    from spec_backend.backends.base import TokenLimits
    from spec_backend.integrations.vllm_config_hook import resolve

    class SixteenTokens:  # Ascend's fused attention limit, without an NPU
        def check_num_speculative_tokens(self, k: int) -> None:
            TokenLimits(max_query_tokens_per_request=16).check_num_speculative_tokens("ascend", k)

    assert resolve(rsc(), _spec(num_speculative_tokens=15), SixteenTokens()) is not None
    with pytest.raises(ValueError, match=r"at most 16 query tokens.*num_speculative_tokens=16"):
        resolve(rsc(), _spec(num_speculative_tokens=16), SixteenTokens())


def test_engine_config_with_real_speculative_config(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own SpeculativeConfig (ngram) + our flags: start-up passes, V1 runner selected."""
    import os

    from vllm.config import SpeculativeConfig

    spec = SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_max=3, prompt_lookup_min=1
    )
    cfg = vllm_config(rsc(enable_block_verify=True), spec)
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert cfg.use_v2_model_runner is False


def test_v2_runner_requested_explicitly_fails(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.config import SpeculativeConfig

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    spec = SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_max=3, prompt_lookup_min=1
    )
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER=1 asks for Model Runner V2"):
        vllm_config(rsc(), spec)


def test_capture_sizes_follow_our_planner(loaded: Any) -> None:
    from spec_backend.backends import load_backend
    from spec_backend.backends.base import CapturePolicy
    from spec_backend.graphs import plan_capture_sizes
    from spec_backend.integrations.vllm_config_hook import plan_vllm_capture_sizes, to_spec_config

    class Capturing:  # a graph-capturing backend with a 64-token cap and a budget of 4 graphs
        name = "capturing"

        def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
            return CapturePolicy(max_capture_size=64, graph_budget=4)

        def check_num_speculative_tokens(self, k: int) -> None:
            load_backend("reference").check_num_speculative_tokens(k)

    spec = to_spec_config(_spec(num_speculative_tokens=3))
    comp = SimpleNamespace(cudagraph_capture_sizes=None, max_cudagraph_capture_size=None)
    engine = SimpleNamespace(
        compilation_config=comp,
        model_config=SimpleNamespace(enforce_eager=False),
        scheduler_config=SimpleNamespace(max_num_seqs=32, max_num_batched_tokens=2048),
    )
    sizes = plan_vllm_capture_sizes(engine, spec, Capturing())
    assert sizes == plan_capture_sizes(3, 32, 2048, backend=Capturing())
    assert sizes and all(s % 4 == 0 and s <= 64 for s in sizes) and len(sizes) <= 4
    comp.cudagraph_capture_sizes = [1, 2, 3]  # the user's own sizes are left to vLLM
    assert plan_vllm_capture_sizes(engine, spec, Capturing()) is None
    comp.cudagraph_capture_sizes = None
    assert plan_vllm_capture_sizes(engine, spec, load_backend("reference")) is None  # runs eagerly
