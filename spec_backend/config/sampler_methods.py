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
==================  ====================  =============  ================  ========

``strict`` verifies drafts as point masses (q = 1 at the drafted token, no draft logits cached);
``probabilistic`` / ``standard`` use the proposer's draft probabilities when it provides them. Both are
the standard lossless rule (accept with min(1, p/q), resample from norm(max(p - q, 0))). ``block``
(vLLM 0.33) turns on lossless block verification (Sun et al. 2024). The rejection sampler's lossy modes
(``block_verify_mode="cumulative"``, entropy verify) come only from ``RejectionSamplerConfig``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from spec_backend.config.rejection import RejectionSamplerConfig
    from spec_backend.config.speculative import SpeculativeConfig

RejectionSampleMethod = Literal["strict", "probabilistic", "standard", "block", "synthetic"]
SamplerMethod = Literal["standard", "synthetic"]

REJECTION_SAMPLE_METHODS: Final[tuple[str, ...]] = (
    "strict",
    "probabilistic",
    "standard",
    "block",
    "synthetic",
)

#: rejection_sample_method -> the RejectionSampler's ``method`` argument.
SAMPLER_METHOD_BY_NAME: Final[dict[str, SamplerMethod]] = {
    "strict": "standard",
    "probabilistic": "standard",
    "standard": "standard",
    "block": "standard",
    "synthetic": "synthetic",
}


def check_rejection_sample_method(value: object) -> object:
    """Reject an unknown ``rejection_sample_method`` with the value and the accepted names."""
    if isinstance(value, str) and value in REJECTION_SAMPLE_METHODS:
        return value
    raise ValueError(
        f"rejection_sample_method={value!r} is not supported; allowed: {list(REJECTION_SAMPLE_METHODS)} "
        "(strict/probabilistic/standard/block verify losslessly, synthetic is for benchmarking)"
    )


def check_sampler_compatibility(spec: SpeculativeConfig, rs: RejectionSamplerConfig) -> None:
    """Fail (``ValueError``) on combinations of the two configs that cannot run.

    * ``synthetic`` accepts by configured rates: block verification and entropy verification cannot
      apply to it.
    * ``block`` asks for *lossless* block verification: ``block_verify_mode="cumulative"`` contradicts it.
    """
    method = spec.rejection_sample_method
    if method == "synthetic":
        enabled = [
            name for name in ("enable_block_verify", "enable_entropy_verify") if getattr(rs, name) is True
        ]
        if enabled:
            raise ValueError(
                "rejection_sample_method='synthetic' accepts drafts by configured rates and cannot be "
                f"combined with rejection_sampler_config {', '.join(f'{n}=True' for n in enabled)}; "
                "disable them or use rejection_sample_method='standard'"
            )
    if method == "block" and rs.enable_block_verify and rs.block_verify_mode == "cumulative":
        raise ValueError(
            "rejection_sample_method='block' requests lossless block verification, but "
            "rejection_sampler_config has block_verify_mode='cumulative' (lossy); set "
            "block_verify_mode='lossless' or use rejection_sample_method='standard'"
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
]
