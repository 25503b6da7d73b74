"""Configuration models (pydantic v2): speculative decoding and rejection-sampler settings."""

from spec_backend.config.methods import MTP_MODEL_TYPES, SPECULATIVE_METHODS, SpeculativeMethod
from spec_backend.config.model_configs import LoadConfigLite, ModelConfigLite, ParallelConfigLite
from spec_backend.config.rejection import ADDITIONAL_CONFIG_KEY, RejectionSamplerConfig
from spec_backend.config.sampler_methods import (
    REJECTION_SAMPLE_METHODS,
    RejectionSampleMethod,
    SamplerMethod,
    check_sampler_compatibility,
    effective_rejection_sampler_config,
)
from spec_backend.config.speculative import MAX_NUM_SPECULATIVE_TOKENS, SpeculativeConfig
from spec_backend.config.synthetic import acceptance_length_to_rates, resolve_synthetic_acceptance_rates
from spec_backend.config.verify_plan import VerifyPlan

__all__ = [
    "ADDITIONAL_CONFIG_KEY",
    "MAX_NUM_SPECULATIVE_TOKENS",
    "MTP_MODEL_TYPES",
    "REJECTION_SAMPLE_METHODS",
    "SPECULATIVE_METHODS",
    "LoadConfigLite",
    "ModelConfigLite",
    "ParallelConfigLite",
    "RejectionSampleMethod",
    "RejectionSamplerConfig",
    "SamplerMethod",
    "SpeculativeConfig",
    "SpeculativeMethod",
    "VerifyPlan",
    "acceptance_length_to_rates",
    "check_sampler_compatibility",
    "effective_rejection_sampler_config",
    "resolve_synthetic_acceptance_rates",
]
