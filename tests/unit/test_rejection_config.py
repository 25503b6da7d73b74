"""RejectionSamplerConfig: defaults, every rule with its message, and reading it from additional_config."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from spec_backend.config import ADDITIONAL_CONFIG_KEY, RejectionSamplerConfig

R = RejectionSamplerConfig


def test_defaults() -> None:
    c = R()
    assert (c.enable_block_verify, c.enable_entropy_verify, c.block_verify_mode) == (False, False, "lossless")
    assert (c.posterior_threshold, c.posterior_alpha) == (0.95, 0.4)
    assert c.lossless and ADDITIONAL_CONFIG_KEY == "rejection_sampler_config"


@pytest.mark.parametrize(
    ("kwargs", "lossless"),
    [
        ({"enable_block_verify": True}, True),
        ({"enable_block_verify": True, "block_verify_mode": "cumulative"}, False),
        ({"block_verify_mode": "cumulative"}, True),  # mode without block verify changes nothing
        ({"enable_entropy_verify": True}, False),
    ],
)
def test_lossless_flag(kwargs: dict[str, Any], lossless: bool) -> None:
    assert R(**kwargs).lossless is lossless


@pytest.mark.parametrize("threshold", [1e-9, 0.5, 1, 1.0])
def test_threshold_accepted(threshold: float) -> None:
    assert R(posterior_threshold=threshold).posterior_threshold == float(threshold)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"posterior_threshold": 0.0}, r"posterior_threshold must be in \(0, 1\], got 0.0"),
        ({"posterior_threshold": 1.5}, r"posterior_threshold must be in \(0, 1\], got 1.5"),
        ({"posterior_threshold": math.nan}, r"posterior_threshold must be in \(0, 1\], got nan"),
        ({"posterior_threshold": True}, "posterior_threshold must be a number, got bool: True"),
        ({"posterior_threshold": "0.9"}, "posterior_threshold must be a number, got str: '0.9'"),
        ({"posterior_alpha": -0.1}, "posterior_alpha must be a finite number >= 0, got -0.1"),
        ({"posterior_alpha": math.inf}, "posterior_alpha must be a finite number >= 0, got inf"),
        ({"posterior_alpha": math.nan}, "posterior_alpha must be a finite number >= 0, got nan"),
        ({"posterior_alpha": False}, "posterior_alpha must be a number, got bool: False"),
        ({"posterior_alpha": 10**400}, "posterior_alpha is out of range"),
        ({"enable_block_verify": 1}, "valid boolean"),
        ({"enable_entropy_verify": "true"}, "valid boolean"),
        ({"block_verify_mode": "fast"}, "'lossless' or 'cumulative'"),
        ({"unknown": 1}, "Extra inputs are not permitted"),
    ],
)
def test_rules(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        R(**kwargs)


def test_frozen() -> None:
    with pytest.raises(ValidationError, match="frozen"):
        R().enable_block_verify = True


def test_from_mapping() -> None:
    assert R.from_mapping(None) == R()
    assert R.from_mapping({"enable_entropy_verify": True}).enable_entropy_verify
    with pytest.raises(
        ValueError, match=r"unknown rejection_sampler_config key\(s\) \['bogus'\]; allowed keys: "
    ):
        R.from_mapping({"bogus": 1})
    allowed = (
        "['block_verify_mode', 'enable_block_verify', 'enable_entropy_verify', 'posterior_alpha', "
        "'posterior_threshold']"
    )
    with pytest.raises(ValueError, match=re.escape(f"['posterior_thresold']; allowed keys: {allowed}")):
        R.from_mapping({"posterior_thresold": 0.9})
    with pytest.raises(ValueError, match=r"\[1, 'a'\]"):  # mixed key types are reported, not a TypeError
        R.from_mapping({1: 2, "a": 3})
    with pytest.raises(ValueError, match=r"must be a mapping \(dict\), got list: \[1\]"):
        R.from_mapping([1])


@pytest.mark.parametrize(
    ("additional", "expected"),
    [
        (None, R()),
        ({}, R()),
        ({"other_plugin": {"x": 1}}, R()),
        ({"rejection_sampler_config": {"enable_block_verify": True}}, R(enable_block_verify=True)),
        ('{"rejection_sampler_config": {"posterior_alpha": 0}}', R(posterior_alpha=0.0)),
        ("", R()),
        ("  ", R()),
        ({"rejection_sampler_config": None}, R()),
    ],
)
def test_from_additional_config(additional: Any, expected: RejectionSamplerConfig) -> None:
    assert R.from_additional_config(additional) == expected


@pytest.mark.parametrize(
    ("additional", "match"),
    [
        ("{not json", "additional_config is not valid JSON"),
        ("[" * 100_000, "additional_config is not valid JSON"),
        ("[1, 2]", "additional_config must be a mapping, a JSON object string or None, got list"),
        ("null", "got NoneType"),
        (42, "got int: 42"),
        ({"rejection_sampler_config": "on"}, r"rejection_sampler_config must be a mapping \(dict\), got str"),
        ({"rejection_sampler_config": {"enable_block_verify": "yes"}}, "valid boolean"),
        ('{"rejection_sampler_config": {"posterior_threshold": true}}', "must be a number, got bool"),
    ],
)
def test_from_additional_config_errors(additional: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        R.from_additional_config(additional)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5,
)
_keys = st.sampled_from([*R.model_fields, "bogus"])
_values = st.one_of(
    _json, st.floats(0, 2), st.sampled_from(["lossless", "cumulative"]), st.booleans(), st.integers(-1, 2)
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=5), st.booleans())
def test_random_additional_config_validates_or_raises_value_error(cfg: dict[str, Any], as_json: bool) -> None:
    additional: Any = {ADDITIONAL_CONFIG_KEY: cfg}
    try:
        c = R.from_additional_config(json.dumps(additional) if as_json else additional)
    except ValueError:  # ValidationError included
        return
    assert 0 < c.posterior_threshold <= 1 and c.posterior_alpha >= 0
    assert R.from_mapping(c.model_dump()) == c


def test_method_literal_and_runtime_list_agree() -> None:
    """``SpeculativeMethod`` (static type) must list exactly ``SPECULATIVE_METHODS`` (runtime check)."""
    from typing import get_args

    from spec_backend.config import SPECULATIVE_METHODS, SpeculativeMethod

    assert sorted(get_args(SpeculativeMethod)) == sorted(SPECULATIVE_METHODS)
