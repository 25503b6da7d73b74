"""``rejection_sample_method`` names and how they combine with ``RejectionSamplerConfig``.

Two vocabularies are accepted, so configurations written for either vLLM generation carry over:

==================  ====================  =============  ================  ========
name                sampler method        block verify   uses draft probs  lossless
==================  ====================  =============  ================  ========
``strict``          ``standard``          as configured  no (point mass)   yes
``probabilistic``   ``standard``          as configured  yes               yes
``standard``        ``standard``          as configured  yes               yes
``block``           ``standard``          on, lossless   yes               yes
``synthetic``       ``synthetic``         forbidden      no                no (benchmarking)
``fly``             ``fly``               forbidden      yes               no (vLLM 0.33's FLy)
==================  ====================  =============  ================  ========

``strict`` verifies drafts as point masses (q = 1 at the drafted token, no draft logits cached);
``probabilistic`` / ``standard`` use the proposer's draft probabilities when it provides them. Both are
the standard lossless rule (accept with min(1, p/q), resample from norm(max(p - q, 0))). ``block``
(vLLM 0.33) turns on lossless block verification (Sun et al. 2024). ``fly`` (vLLM 0.33) rescues a rejected
draft when the next ``fly_window_size`` drafts are accepted and the target's top-k entropy there is at least
``fly_entropy_threshold``: **lossy** (``spec_backend.sampling.fly``). The rejection sampler's lossy modes
(``block_verify_mode="cumulative"``, entropy verify) come only from ``RejectionSamplerConfig``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, Literal

from spec_backend.verify_rules import SamplerMethod

if TYPE_CHECKING:
    from spec_backend.config.rejection import RejectionSamplerConfig
    from spec_backend.config.speculative import SpeculativeConfig

logger = logging.getLogger("spec_backend.config")

RejectionSampleMethod = Literal["strict", "probabilistic", "standard", "block", "synthetic", "fly"]

REJECTION_SAMPLE_METHODS: Final[tuple[str, ...]] = (
    "strict",
    "probabilistic",
    "standard",
    "block",
    "synthetic",
    "fly",
)

#: rejection_sample_method -> the RejectionSampler's ``method`` argument.
SAMPLER_METHOD_BY_NAME: Final[dict[str, SamplerMethod]] = {
    "strict": "standard",
    "probabilistic": "standard",
    "standard": "standard",
    "block": "standard",
    "synthetic": "synthetic",
    "fly": "fly",
}


def check_rejection_sample_method(value: object) -> object:
    """Reject an unknown ``rejection_sample_method`` with the value and the accepted names."""
    if isinstance(value, str) and value in REJECTION_SAMPLE_METHODS:
        return value
    raise ValueError(
        f"rejection_sample_method={value!r} is not supported; allowed: {list(REJECTION_SAMPLE_METHODS)} "
        "(strict/probabilistic/standard/block verify losslessly, synthetic is for benchmarking, fly is lossy)"
    )


def check_sampler_compatibility(spec: SpeculativeConfig, rs: RejectionSamplerConfig) -> None:
    """Fail (``ValueError``) on combinations of the two configs that cannot run.

    * ``synthetic`` accepts by configured rates and ``fly`` by its rescue window: block verification and
      entropy verification cannot apply to them.
    * ``block`` asks for *lossless* block verification: ``block_verify_mode="cumulative"`` contradicts it.
    """
    method = spec.rejection_sample_method
    if method in ("synthetic", "fly"):
        enabled = [
            name for name in ("enable_block_verify", "enable_entropy_verify") if getattr(rs, name) is True
        ]
        if enabled:
            raise ValueError(
                f"rejection_sample_method={method!r} has its own acceptance rule and cannot be "
                f"combined with rejection_sampler_config {', '.join(f'{n}=True' for n in enabled)}; "
                "disable them or use rejection_sample_method='standard'"
            )
    if method == "block" and rs.enable_block_verify and rs.block_verify_mode == "cumulative":
        raise ValueError(
            "rejection_sample_method='block' requests lossless block verification, but "
            "rejection_sampler_config has block_verify_mode='cumulative' (lossy); set "
            "block_verify_mode='lossless' or use rejection_sample_method='standard'"
        )


def resolve_verification_fields(spec: SpeculativeConfig) -> None:
    """Resolve the method-specific verification fields in place (``num_speculative_tokens`` is set).

    ``synthetic``: the rates from ``synthetic_acceptance_rates`` or ``synthetic_acceptance_length``
    (which is then cleared); other methods may not set them. ``fly``: the window size (vLLM's default
    ``min(6, K - 1)``) and its rules; a warning names the mode lossy.
    """
    from spec_backend.config.synthetic import resolve_synthetic_acceptance_rates

    k = spec.num_speculative_tokens
    assert k is not None
    if spec.rejection_sample_method == "synthetic":
        spec.synthetic_acceptance_rates = resolve_synthetic_acceptance_rates(
            k, spec.synthetic_acceptance_rates, spec.synthetic_acceptance_length
        )
        spec.synthetic_acceptance_length = None
    elif spec.synthetic_acceptance_rates is not None or spec.synthetic_acceptance_length is not None:
        raise ValueError(
            "synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
            f"rejection_sample_method='synthetic', got {spec.rejection_sample_method!r}"
        )
    fly = spec.fly
    if fly is not None:
        spec.fly_window_size = fly.window_size
        logger.warning(
            "rejection_sample_method='fly' is LOSSY: FLy accepts some drafts the target rejects "
            "(window %d, entropy threshold %g, top-k %d)",
            fly.window_size,
            fly.entropy_threshold,
            fly.entropy_top_k,
        )


def effective_rejection_sampler_config(
    spec: SpeculativeConfig, rs: RejectionSamplerConfig | None = None
) -> RejectionSamplerConfig:
    """The sampler config to run with: ``rs`` (or defaults) after the compatibility check, with block
    verification turned on (lossless) when ``rejection_sample_method='block'``."""
    from spec_backend.config.rejection import RejectionSamplerConfig

    rs = rs if rs is not None else RejectionSamplerConfig()
    check_sampler_compatibility(spec, rs)
    if spec.rejection_sample_method == "block" and not rs.enable_block_verify:
        return rs.model_copy(update={"enable_block_verify": True, "block_verify_mode": "lossless"})
    return rs


__all__ = [
    "REJECTION_SAMPLE_METHODS",
    "SAMPLER_METHOD_BY_NAME",
    "RejectionSampleMethod",
    "SamplerMethod",
    "check_rejection_sample_method",
    "check_sampler_compatibility",
    "effective_rejection_sampler_config",
    "resolve_verification_fields",
]
