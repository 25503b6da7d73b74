"""``RejectionSamplerConfig``: the verification flags read from ``additional_config``.

Keys match vllm-ascend's ``rejection_sampler_config`` so existing configurations carry over. Block
verification is *lossless* by default (Sun et al. 2024); ``block_verify_mode="cumulative"`` and entropy
verify reproduce vllm-ascend's rules and are lossy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from spec_backend.verify_rules import select_rule

ADDITIONAL_CONFIG_KEY = "rejection_sampler_config"


class RejectionSamplerConfig(BaseModel):
    """Which verification rule the rejection sampler applies.

    * ``enable_block_verify``: verify the draft block jointly (``block_verify_mode`` picks the rule).
    * ``block_verify_mode``: ``"lossless"`` (default; Sun et al. 2024, Alg. 2) or ``"cumulative"``
      (vllm-ascend's longest-prefix rule; **lossy**).
    * ``enable_entropy_verify``: accept if ρ ≥ min(exp(−α·H(p)), θ)·u (**lossy**).
    * ``posterior_threshold`` θ in (0, 1]; ``posterior_alpha`` α ≥ 0.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    enable_block_verify: StrictBool = False
    enable_entropy_verify: StrictBool = False
    posterior_threshold: float = Field(default=0.95)
    posterior_alpha: float = Field(default=0.4)
    block_verify_mode: Literal["lossless", "cumulative"] = "lossless"

    @field_validator("posterior_threshold", mode="before")
    @classmethod
    def _check_threshold(cls, v: Any) -> float:
        value = _strict_number("posterior_threshold", v)
        if not 0.0 < value <= 1.0:
            raise ValueError(f"posterior_threshold must be in (0, 1], got {v!r}")
        return value

    @field_validator("posterior_alpha", mode="before")
    @classmethod
    def _check_alpha(cls, v: Any) -> float:
        value = _strict_number("posterior_alpha", v)
        if not value >= 0.0 or value == float("inf"):
            raise ValueError(f"posterior_alpha must be a finite number >= 0, got {v!r}")
        return value

    @property
    def lossless(self) -> bool:
        """True when the rule these flags select (``spec_backend.verify_rules``) leaves the target
        distribution unchanged."""
        return select_rule(self, "standard").lossless

    @classmethod
    def from_mapping(cls, value: Any) -> RejectionSamplerConfig:
        """Validate a ``rejection_sampler_config`` mapping; unknown keys fail listing the allowed ones."""
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise ValueError(
                f"{ADDITIONAL_CONFIG_KEY} must be a mapping (dict), got {type(value).__name__}: {value!r}"
            )
        unknown = sorted(set(value) - set(cls.model_fields), key=str)
        if unknown:
            raise ValueError(
                f"unknown {ADDITIONAL_CONFIG_KEY} key(s) {unknown}; allowed keys: {sorted(cls.model_fields)}"
            )
        return cls.model_validate(dict(value))

    @classmethod
    def from_additional_config(cls, additional_config: Any) -> RejectionSamplerConfig:
        """Read ``rejection_sampler_config`` from a whole ``additional_config`` (dict, JSON text or None)."""
        if additional_config is None:
            return cls()
        if isinstance(additional_config, str):
            try:
                additional_config = json.loads(additional_config) if additional_config.strip() else {}
            except (ValueError, RecursionError) as exc:  # JSONDecodeError, int digit limit, deep nesting
                raise ValueError(
                    f"additional_config is not valid JSON: {exc}: {additional_config!r}"
                ) from exc
        if not isinstance(additional_config, Mapping):
            raise ValueError(
                "additional_config must be a mapping, a JSON object string or None, "
                f"got {type(additional_config).__name__}: {additional_config!r}"
            )
        return cls.from_mapping(additional_config.get(ADDITIONAL_CONFIG_KEY))


def _strict_number(field: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{field} must be a number, got {type(v).__name__}: {v!r}")
    try:
        return float(v)
    except OverflowError:  # an int too large for a float
        raise ValueError(f"{field} is out of range, got {v!r}") from None


__all__ = ["ADDITIONAL_CONFIG_KEY", "RejectionSamplerConfig", "ValidationError"]
