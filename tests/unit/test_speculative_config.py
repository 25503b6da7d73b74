"""SpeculativeConfig: defaults, every validation rule (with its message), method inference, binding."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from spec_backend.config import (
    RejectionSamplerConfig,
    SpeculativeConfig,
    check_sampler_compatibility,
    effective_rejection_sampler_config,
)

S = SpeculativeConfig.model_validate
NG = {"method": "ngram", "num_speculative_tokens": 3}


def target(model_type: str = "llama", **kw: Any) -> dict[str, Any]:
    hf = {"model_type": model_type, **kw.pop("hf", {})}
    return {"model": "org/target", "hf_config": hf, **kw}


def draft(model: str = "org/draft", **hf: Any) -> dict[str, Any]:
    return {"model": model, "hf_config": hf}


def test_defaults() -> None:
    c = S(NG)
    assert (c.method, c.model, c.num_speculative_tokens) == ("ngram", "ngram", 3)
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)
    assert c.rejection_sample_method == "strict" and c.sampler_method == "standard"
    assert (c.suffix_decoding_max_tree_depth, c.suffix_decoding_max_cached_requests) == (24, 10000)
    assert (c.suffix_decoding_max_spec_factor, c.suffix_decoding_min_token_prob) == (1.0, 0.1)
    assert c.enforce_eager is None and c.speculative_token_tree is None and c.disable_by_batch_size is None
    assert not (c.parallel_drafting or c.disable_padded_drafter_batch or c.use_local_argmax_reduction)
    assert c.synthetic_acceptance_rates is None and c.draft_model_config is None


@pytest.mark.parametrize(
    ("cfg", "method"),
    [
        ({"model": "ngram"}, "ngram"),
        ({"model": "[ngram]"}, "ngram"),
        ({"method": "[ngram]"}, "ngram"),
        ({"model": "yuhuili/EAGLE-LLaMA3-Instruct-8B"}, "eagle"),
        ({"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}, "eagle3"),
        ({"model": "AngelSlim/Qwen3-8B_eagle3"}, "eagle3"),
        ({"model": "z-lab/Qwen3-4B-DFlash-b16"}, "dflash"),
        ({"model": "org/draft", "draft_model_config": draft(model_type="medusa")}, "medusa"),
        ({"model": "org/draft", "draft_model_config": draft(model_type="mlp_speculator")}, "mlp_speculator"),
        ({"model": "org/draft", "draft_model_config": draft(model_type="deepseek_mtp")}, "mtp"),
        ({"draft_model_config": draft(model_type="deepseek_v3", num_nextn_predict_layers=1)}, "mtp"),
        ({"model": "org/draft"}, "draft_model"),
        ({"method": "medusa", "model": "org/heads"}, "medusa"),  # unknown model_type: trusted
        (
            {"method": "eagle", "model": "org/x", "draft_model_config": draft("org/x", model_type="llama")},
            "eagle",
        ),
    ],
)
def test_method_inference(cfg: dict[str, Any], method: str) -> None:
    assert S({"num_speculative_tokens": 1, **cfg}).method == method


def test_dflash_turns_on_parallel_drafting() -> None:
    c = S({"model": "z-lab/Qwen3-4B-DFlash-b16", "num_speculative_tokens": 4})
    assert c.parallel_drafting and c.use_dflash() and c.use_eagle() and c.max_num_new_slots_for_drafting == 3


def test_deprecated_mtp_method_maps_to_mtp(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="spec_backend.config"):
        c = S({"method": "deepseek_mtp", "num_speculative_tokens": 1})
    assert c.method == "mtp" and "deprecated" in caplog.text


def test_mtp_reuses_target_checkpoint() -> None:
    t = target("deepseek_v32", hf={"num_nextn_predict_layers": 1}, quantization="fp8", max_model_len=4096)
    c = S({"method": "mtp", "num_speculative_tokens": 1, "target_model_config": t})
    assert (c.model, c.quantization, c.enforce_eager) == ("org/target", "fp8", True)
    assert c.draft_model_config is not None and c.draft_model_config.hf_config["model_type"] == "deepseek_mtp"
    assert c.draft_model_config.max_model_len == 4096


def test_mtp_without_target_skips_model_resolution() -> None:
    c = S({"method": "mtp", "num_speculative_tokens": 2})
    assert c.model is None and c.draft_model_config is None


def test_mtp_contradicting_known_model_type() -> None:
    with pytest.raises(ValueError, match="method='mtp' does not match the draft model 'org/target'"):
        S({"method": "mtp", "num_speculative_tokens": 1, "target_model_config": target("llama")})


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"method": "eagl", "num_speculative_tokens": 1}, r"'eagl' is not a known .*did you mean 'eagle'"),
        ({"num_speculative_tokens": 0, "method": "ngram"}, "greater than 0"),
        ({"num_speculative_tokens": True, "method": "ngram"}, "valid integer"),
        ({"num_speculative_tokens": "3", "method": "ngram"}, "valid integer"),
        ({**NG, "num_speculative_tokens": 2000}, "num_speculative_tokens=2000 is larger than 1024"),
        ({"method": "ngram"}, "num_speculative_tokens is required"),
        ({}, "num_speculative_tokens is required"),
        ({**NG, "tensor_parallel_size": 2}, "tensor_parallel_size=2 is not .*draft_tensor_parallel_size"),
        (
            {**NG, "num_speculative_token": 3},
            r"unknown .*'num_speculative_token'.*allowed keys: \['adaptive_draft_length', 'code_rev",
        ),
        ({"method": "eagle", "num_speculative_tokens": 2}, "method='eagle' needs draft weights"),
        ({**NG, "prompt_lookup_min": 4, "prompt_lookup_max": 3}, "min=4 must be <= prompt_lookup_max=3"),
        ({**NG, "prompt_lookup_min": 0}, "greater than or equal to 1"),
        ({**NG, "disable_by_batch_size": 1}, "disable_by_batch_size must be >= 2 .*got 1"),
        ({**NG, "suffix_decoding_max_tree_depth": 0}, "suffix_decoding_max_tree_depth must be >= 1, got 0"),
        ({**NG, "suffix_decoding_max_cached_requests": -1}, "max_cached_requests must be >= 0 .*got -1"),
        ({**NG, "suffix_decoding_max_spec_factor": -0.5}, "max_spec_factor must be a finite number >= 0"),
        ({**NG, "suffix_decoding_max_spec_factor": math.inf}, "max_spec_factor must be a finite number >= 0"),
        ({**NG, "suffix_decoding_min_token_prob": 1.5}, r"min_token_prob must be in \[0, 1\], got 1.5"),
        ({**NG, "suffix_decoding_min_token_prob": math.nan}, r"min_token_prob must be in \[0, 1\], got nan"),
        ({**NG, "rejection_sample_method": "lossy"}, "method='lossy' is not supported; allowed"),
        ({**NG, "parallel_drafting": True}, "parallel_drafting=True works only with .*got method='ngram'"),
        ({**NG, "draft_tensor_parallel_size": 0}, "greater than or equal to 1"),
        ({**NG, "max_model_len": 0}, "greater than or equal to 1"),
        ({**NG, "target_model_config": {"model": "t", "bogus": 1}}, "Extra inputs are not permitted"),
        ({"model": "org/d", "num_speculative_tokens": 1, "draft_model_config": draft("org/other")},
         "draft_model_config.model='org/other' does not match model='org/d'"),
        ({"method": "medusa", "model": "org/x", "num_speculative_tokens": 1,
          "draft_model_config": draft("org/x", model_type="llama")},
         "method='medusa' does not match the draft model 'org/x' whose model_type is 'llama'"),
    ],
)  # fmt: skip
def test_validation_errors(cfg: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        S(cfg)


def test_ngram_window_defaults() -> None:
    assert (
        S({**NG, "prompt_lookup_min": 3}).prompt_lookup_max,
        S({**NG, "prompt_lookup_max": 7}).prompt_lookup_min,
    ) == (
        3,
        7,
    )
    assert S({"method": "ngram_gpu", "num_speculative_tokens": 2}).model == "ngram_gpu"


def test_suffix_defaults_k_to_tree_depth(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="spec_backend.config"):
        assert S({"method": "suffix"}).num_speculative_tokens == 24
    assert "suffix_decoding_max_tree_depth=24" in caplog.text
    assert S({"method": "suffix", "suffix_decoding_max_tree_depth": 8}).num_speculative_tokens == 8
    assert S({"method": "suffix", "num_speculative_tokens": 4}).model == "suffix"


SYN = {**NG, "rejection_sample_method": "synthetic"}


@pytest.mark.parametrize(
    ("k", "length", "rates"),
    [(3, 1.0, [0.0, 0.0, 0.0]), (3, 2.5, [1.0, 0.5, 0.0]), (3, 4.0, [1.0, 1.0, 1.0]), (1, 1.25, [0.25])],
)
def test_synthetic_length_to_rates(k: int, length: float, rates: list[float]) -> None:
    c = S({**SYN, "num_speculative_tokens": k, "synthetic_acceptance_length": length})
    assert c.synthetic_acceptance_rates == pytest.approx(rates) and c.synthetic_acceptance_length is None
    assert 1 + sum(c.synthetic_acceptance_rates or []) == pytest.approx(length)
    assert c.sampler_method == "synthetic"


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({}, "needs exactly one of synthetic_acceptance_rates or synthetic_acceptance_length"),
        ({"synthetic_acceptance_rates": [1, 1, 1], "synthetic_acceptance_length": 2.0}, "exactly one of"),
        ({"synthetic_acceptance_rates": [0.5, 0.4]}, "num_speculative_tokens=3.*got 2 entries"),
        (
            {"synthetic_acceptance_rates": [1.2, 0.5, 0.1]},
            r"entries must be in \[0, 1\], got \[1.2, 0.5, 0.1\]",
        ),
        (
            {"synthetic_acceptance_rates": [0.5, 0.6, 0.1]},
            "must be non-increasing .*entry 1 rises above entry 0",
        ),
        (
            {"synthetic_acceptance_length": 4.5},
            r"must be in \[1, num_speculative_tokens \+ 1\] = \[1, 4\], got 4.5",
        ),
        ({"synthetic_acceptance_length": 0.5}, r"= \[1, 4\], got 0.5"),
        ({"synthetic_acceptance_length": math.nan}, "got nan"),
    ],
)
def test_synthetic_errors(extra: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        S({**SYN, **extra})


def test_synthetic_rates_only_with_synthetic() -> None:
    assert S({**SYN, "synthetic_acceptance_rates": [0.9, 0.5, 0.5]}).synthetic_acceptance_rates == [
        0.9,
        0.5,
        0.5,
    ]
    with pytest.raises(
        ValidationError, match=r"only valid with rejection_sample_method='synthetic', got 'strict'"
    ):
        S({**NG, "synthetic_acceptance_length": 2.0})


DM = {"model": "org/draft", "num_speculative_tokens": 3}


def test_draft_tensor_parallel_size() -> None:
    tp4 = {"tensor_parallel_size": 4}
    assert S({**DM, "target_parallel_config": tp4}).draft_tensor_parallel_size == 4
    c = S({**DM, "target_parallel_config": tp4, "draft_tensor_parallel_size": 1})
    assert c.draft_parallel_config is not None and c.draft_parallel_config.tensor_parallel_size == 1
    assert S({**DM, "draft_tensor_parallel_size": 3}).draft_tensor_parallel_size == 3  # no target: skipped
    mlp = {**DM, "draft_model_config": draft(model_type="mlp_speculator"), "target_parallel_config": tp4}
    assert S(mlp).draft_tensor_parallel_size == 1
    with pytest.raises(ValidationError, match=r"draft_tensor_parallel_size=2 is not allowed: .*1 or .*\(4\)"):
        S({**DM, "target_parallel_config": tp4, "draft_tensor_parallel_size": 2})
    heads = {**DM, "draft_model_config": draft(num_attention_heads=6), "draft_tensor_parallel_size": 4}
    with pytest.raises(ValidationError, match=r"num_attention_heads=6 is not divisible by .* size 4"):
        S(heads)


def test_draft_max_model_len() -> None:
    both = {
        **DM,
        "target_model_config": target(max_model_len=100),
        "draft_model_config": {**draft(), "max_model_len": 50},
    }

    def resolved(**kw: Any) -> int | None:
        dmc = S({**both, **kw}).draft_model_config
        assert dmc is not None
        return dmc.max_model_len

    assert resolved() == 50 and resolved(max_model_len=20) == 20
    with pytest.raises(
        ValidationError, match=r"max_model_len=60 cannot be larger than the draft model's max_model_len=50"
    ):
        S({**both, "max_model_len": 60})
    with pytest.raises(
        ValidationError, match=r"max_model_len=200 cannot be larger than the target model's .*=100"
    ):
        S({**DM, "target_model_config": target(max_model_len=100), "max_model_len": 200})


def test_token_tree() -> None:
    assert S(DM).speculative_token_tree == "[(0,), (0, 0), (0, 0, 0)]"
    c = S({**DM, "speculative_token_tree": "[(1,), (0, 0), (0,)]"})
    assert c.speculative_token_tree == "[(0,), (1,), (0, 0)]" and c.token_tree == [(0,), (1,), (0, 0)]
    assert S({**DM, "speculative_token_tree": [[0, 0], [0]]}).speculative_token_tree == "[(0,), (0, 0)]"
    assert S(NG).token_tree is None


@pytest.mark.parametrize(
    ("tree", "match"),
    [
        ("[(0,", "must be a Python literal list of tuples"),
        ("[]", "non-empty list of tuples"),
        ("[(0,), (0, -1)]", "non-negative ints .*got node \\(0, -1\\)"),
        ("[(0,), (0,)]", "duplicate nodes"),
        ("[(0,), (1, 0)]", r"node \(1, 0\) has no parent \(1,\)"),
    ],
)
def test_token_tree_errors(tree: str, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        S({**DM, "speculative_token_tree": tree})


def test_n_predict() -> None:
    dmc = draft(n_predict=3, num_lookahead_tokens=1)
    assert S({"model": "org/draft", "draft_model_config": dmc}).num_speculative_tokens == 3
    c = S({**DM, "num_speculative_tokens": 6, "draft_model_config": dmc})
    assert c.draft_model_config is not None and c.draft_model_config.hf_config["num_lookahead_tokens"] == 6
    assert S({**DM, "num_speculative_tokens": 2, "draft_model_config": dmc}).num_speculative_tokens == 2
    with pytest.raises(
        ValidationError, match=r"num_speculative_tokens=4 must be a multiple of .*n_predict=3"
    ):
        S({**DM, "num_speculative_tokens": 4, "draft_model_config": dmc})
    with pytest.raises(ValidationError, match="n_predict must be a positive integer, got 'two'"):
        S({**DM, "draft_model_config": draft(n_predict="two")})
    with pytest.raises(ValidationError, match="neither num_speculative_tokens nor speculative_token_tree"):
        S({"model": "org/draft"})
    mtp = target("deepseek_v3", hf={"num_nextn_predict_layers": 2})
    with pytest.raises(ValidationError, match=r"num_speculative_tokens=3 must be a multiple .*n_predict=2"):
        S({"method": "mtp", "num_speculative_tokens": 3, "target_model_config": mtp})


def test_vocab_sizes_and_aux_hidden_states() -> None:
    t = target(vocab_size=32000)
    assert S(
        {**DM, "target_model_config": t, "draft_model_config": draft(vocab_size=32000)}
    ).uses_draft_model()
    assert S({**DM, "target_model_config": t}).method == "draft_model"  # draft vocab unknown: skipped
    with pytest.raises(
        ValidationError, match=r"same vocabulary size .*target vocab_size=32000, draft vocab_size=100"
    ):
        S({**DM, "target_model_config": t, "draft_model_config": draft(vocab_size=100)})
    eagle3 = {"model": "org/eagle3-head", "num_speculative_tokens": 2}
    assert S({**eagle3, "target_model_config": target("qwen3")}).method == "eagle3"
    with pytest.raises(ValidationError, match=r"method='eagle3' needs auxiliary hidden states.*got 'gpt2'"):
        S({**eagle3, "target_model_config": target("gpt2")})


def test_queries_and_hash() -> None:
    assert S(DM).max_num_new_slots_for_drafting == 1
    assert S({**DM, "parallel_drafting": True}).max_num_new_slots_for_drafting == 3
    eagle = S({"model": "yuhuili/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 2})
    assert eagle.use_eagle() and eagle.max_num_new_slots_for_drafting == 0 and not eagle.uses_draft_model()
    assert S({"method": "ngram_gpu", "num_speculative_tokens": 2}).use_ngram_gpu()
    assert S({"method": "extract_hidden_states", "num_speculative_tokens": 1}).uses_extract_hidden_states()
    e3 = {"model": "org/eagle3", "num_speculative_tokens": 2}
    ids = {**e3, "draft_model_config": draft("org/eagle3", eagle_aux_hidden_state_layer_ids=[1, 2])}
    hashes = {S(c).compute_hash() for c in (e3, ids, DM)}
    assert len(hashes) == 3 and S(DM).compute_hash() == S(NG).compute_hash()


@pytest.mark.parametrize(
    ("name", "sampler", "block", "probs"),
    [
        ("strict", "standard", False, False),
        ("probabilistic", "standard", False, True),
        ("standard", "standard", False, True),
        ("block", "standard", True, True),
        ("synthetic", "synthetic", False, False),
    ],
)
def test_rejection_sample_method_mapping(name: str, sampler: str, block: bool, probs: bool) -> None:
    extra = {"synthetic_acceptance_length": 2.0} if name == "synthetic" else {}
    c = S({**NG, "rejection_sample_method": name, **extra})
    assert (c.sampler_method, c.block_verify_requested, c.uses_draft_probs) == (sampler, block, probs)
    assert effective_rejection_sampler_config(c).enable_block_verify is block


def test_sampler_compatibility() -> None:
    syn = S({**SYN, "synthetic_acceptance_length": 2.0})
    check_sampler_compatibility(syn, RejectionSamplerConfig())
    for flag in ("enable_block_verify", "enable_entropy_verify"):
        with pytest.raises(ValueError, match=f"'synthetic' .*cannot be combined with .*{flag}=True"):
            check_sampler_compatibility(syn, RejectionSamplerConfig.model_validate({flag: True}))
    block = S({**NG, "rejection_sample_method": "block"})
    cumulative = RejectionSamplerConfig(enable_block_verify=True, block_verify_mode="cumulative")
    with pytest.raises(ValueError, match=r"'block' requests lossless block verification.*'cumulative'"):
        effective_rejection_sampler_config(block, cumulative)
    rs = effective_rejection_sampler_config(block, RejectionSamplerConfig(enable_entropy_verify=True))
    assert rs.enable_block_verify and rs.block_verify_mode == "lossless" and rs.enable_entropy_verify
    check_sampler_compatibility(S(NG), cumulative)


def test_from_json() -> None:
    assert SpeculativeConfig.from_json(json.dumps(NG)) == S(NG)
    with pytest.raises(ValueError, match="speculative_config is not valid JSON"):
        SpeculativeConfig.from_json("{method: ngram}")
    with pytest.raises(ValueError, match=r"must be an object .*got list"):
        SpeculativeConfig.from_json("[1, 2]")
    with pytest.raises(ValidationError, match="unknown speculative_config key"):
        SpeculativeConfig.from_json('{"method": "ngram", "k": 3}')


def test_bind_to_backends() -> None:
    from spec_backend_ascend import AscendBackend

    from spec_backend.backends.base import TokenLimits

    k15 = S({**NG, "num_speculative_tokens": 15})
    assert k15.bind(AscendBackend()) is k15
    with pytest.raises(ValueError, match=r"'ascend'.*\b16\b"):
        S({**NG, "num_speculative_tokens": 16}).bind(AscendBackend())

    class Tiny:
        def check_num_speculative_tokens(self, k: int) -> None:
            TokenLimits(max_speculative_tokens=2).check_num_speculative_tokens("tiny", k)

    with pytest.raises(
        ValueError, match="num_speculative_tokens=3 exceeds the limit of backend 'tiny': at most 2"
    ):
        S(NG).bind(Tiny())


@pytest.mark.parametrize(
    "cfg",
    [
        NG,
        {"method": "suffix"},
        {**DM, "target_model_config": target(max_model_len=64),
         "target_parallel_config": {"tensor_parallel_size": 2}},
        {"method": "mtp", "num_speculative_tokens": 2,
         "target_model_config": target("qwen3_5", hf={"mtp_num_hidden_layers": 1})},
        {"model": "org/x",
         "draft_model_config": draft("org/x", architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)},
        {"method": "extract_hidden_states", "num_speculative_tokens": 1, "target_model_config": target()},
        {**SYN, "synthetic_acceptance_length": 3.0},
    ],
)  # fmt: skip
def test_round_trip(cfg: dict[str, Any]) -> None:
    c = S(cfg)
    assert S(c.model_dump()) == c
    assert SpeculativeConfig.from_json(c.model_dump_json()) == c


# --- property: random JSON-like configs validate or raise ValueError, never anything else -------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
_plausible: dict[str, st.SearchStrategy[Any]] = {
    "method": st.sampled_from(
        ["ngram", "[ngram]", "suffix", "mtp", "eagle", "eagle3", "medusa", "draft_model"]
    ),
    "model": st.sampled_from(["ngram", "org/EAGLE-x", "org/draft", "org/target"]),
    "num_speculative_tokens": st.integers(-2, 40),
    "rejection_sample_method": st.sampled_from(["strict", "standard", "block", "synthetic"]),
    "synthetic_acceptance_length": st.floats(0, 6),
    "synthetic_acceptance_rates": st.lists(st.floats(0, 1), max_size=5),
    "speculative_token_tree": st.sampled_from(["[(0,), (1,)]", "[(0,), (0, 0)]", "[(1,)]"]),
    "target_model_config": st.fixed_dictionaries(
        {"model": st.just("org/target")},
        optional={"max_model_len": st.integers(0, 99), "vocab_size": st.integers(1, 9), "hf_config": _json},
    ),
    "draft_model_config": st.fixed_dictionaries(
        {"model": st.sampled_from(["org/draft", "org/target"])}, optional={"hf_config": _json}
    ),
    "target_parallel_config": st.fixed_dictionaries({"tensor_parallel_size": st.integers(0, 4)}),
}
_by_name: dict[str, st.SearchStrategy[Any]] = {
    "bool": st.booleans(),
    "int": st.integers(1, 6),
    "float": st.floats(0, 1.2),
    "str": st.sampled_from(["org/draft", "fp8", "main"]),
}


def _sane(key: str) -> st.SearchStrategy[Any]:
    annotation = str(SpeculativeConfig.model_fields[key].annotation)
    if key == "tensor_parallel_size":
        return st.none()
    fallback = next((v for name, v in _by_name.items() if name in annotation), st.none())
    value = _plausible.get(key, fallback)
    return st.none() | value if "None" in annotation else value


_keys = sorted(SpeculativeConfig.model_fields)
_sane_entry = st.sampled_from(_keys).flatmap(lambda k: st.tuples(st.just(k), _sane(k)))
_any_entry = st.sampled_from(_keys).flatmap(lambda k: st.tuples(st.just(k), _sane(k) | _json))
_configs = st.one_of(
    st.tuples(  # mostly valid: exercises the resolution paths
        st.fixed_dictionaries(
            {"num_speculative_tokens": st.integers(1, 8)},
            optional={"method": _plausible["method"], "model": _plausible["model"]},
        ),
        st.lists(_sane_entry, max_size=6).map(dict),
    ).map(lambda t: {**t[0], **t[1]}),
    st.tuples(  # anything goes, unknown keys included
        st.lists(_any_entry, max_size=7).map(dict),
        st.just({}) | st.dictionaries(st.text(max_size=5), _json, max_size=1),
    ).map(lambda t: {**t[0], **t[1]}),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_configs)
def test_random_configs_validate_or_raise_value_error(cfg: dict[str, Any]) -> None:
    try:
        c = S(cfg)
    except ValueError:  # ValidationError included
        return
    assert c.num_speculative_tokens is not None and c.num_speculative_tokens > 0
    again = S(c.model_dump())
    assert again.model_dump_json() == c.model_dump_json()
    assert len(c.compute_hash()) == 64
    assert SpeculativeConfig.from_json(json.dumps(cfg)).model_dump_json() == c.model_dump_json()
