"""Configuration models (pydantic v2): speculative decoding and rejection-sampler settings."""

from spec_backend.config.rejection import ADDITIONAL_CONFIG_KEY, RejectionSamplerConfig

__all__ = ["ADDITIONAL_CONFIG_KEY", "RejectionSamplerConfig"]
