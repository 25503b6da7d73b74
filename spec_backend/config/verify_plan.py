"""``VerifyPlan``: the verification a rejection sampler runs, resolved once: a rule and its parameters.

One value travels from the configuration (``SpeculativeConfig`` + ``RejectionSamplerConfig``) through
``LLM`` and the engine's ``Verifier`` into ``RejectionSampler``: a rule that needs parameters of its own
(the synthetic rates, FLy's window) carries them here, not as constructor arguments of every layer.

* ``rule`` — the row of ``spec_backend.verify_rules.REGISTRY`` that ``config``'s flags select for the
  sampler method (``rule.method``);
* ``config`` — those flags, and the entropy rule's θ (``posterior_threshold``) and α (``posterior_alpha``);
* ``rates`` — ``synthetic`` only: entry i is P(first i+1 drafts accepted), in [0, 1], non-increasing;
* ``fly`` — ``fly`` only: FLy's window and entropy parameters.

A plan is checked when it is made (``VerifyPlan(...)`` as well as ``VerifyPlan.of`` / ``resolve``): a
parameter the rule does not read is refused by name, never carried and ignored.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, get_args

from spec_backend.config.fly import FlyConfig
from spec_backend.config.rejection import RejectionSamplerConfig
from spec_backend.config.sampler_methods import effective_rejection_sampler_config
from spec_backend.verify_rules import SamplerMethod, VerifyRule, select_rule

if TYPE_CHECKING:
    from spec_backend.config.speculative import SpeculativeConfig

#: the sampler methods, in the order errors list them
SAMPLER_METHODS: tuple[str, ...] = get_args(SamplerMethod)


def _check_rates(method: str, rates: Sequence[float] | None) -> tuple[float, ...] | None:
    """``rates`` as a tuple of floats when ``method`` is ``synthetic``; ``ValueError`` naming the rule."""
    if method != "synthetic":
        if rates is not None:
            raise ValueError(
                f"synthetic_acceptance_rates is only used with method='synthetic', not {method!r}"
            )
        return None
    if rates is None or len(rates) == 0:
        raise ValueError("method='synthetic' needs synthetic_acceptance_rates (a non-empty list of floats)")
    values = [float(r) for r in rates]
    if any(not 0.0 <= r <= 1.0 for r in values):
        raise ValueError(f"synthetic_acceptance_rates must lie in [0, 1], got {values}")
    if any(b > a for a, b in itertools.pairwise(values)):
        raise ValueError(
            "synthetic_acceptance_rates[i] is P(first i+1 drafts accepted) and must be non-increasing, "
            f"got {values}"
        )
    return tuple(values)


@dataclass(frozen=True)
class VerifyPlan:
    """A verification rule with every parameter it reads (see the module docstring)."""

    rule: VerifyRule
    config: RejectionSamplerConfig = field(default_factory=RejectionSamplerConfig)
    rates: tuple[float, ...] | None = None
    fly: FlyConfig | None = None

    def __post_init__(self) -> None:
        method = self.rule.method
        if select_rule(self.config, method) is not self.rule:
            raise ValueError(
                f"VerifyPlan(rule={self.rule.name!r}) does not match its config, which selects "
                f"{select_rule(self.config, method).name!r}; build plans with VerifyPlan.of(config, method)"
            )
        object.__setattr__(self, "rates", _check_rates(method, self.rates))
        if (method == "fly") != (self.fly is not None):
            raise ValueError(
                "method='fly' needs fly=FlyConfig(...), and only it takes one; "
                f"got method={method!r}, fly={self.fly!r}"
            )

    @property
    def method(self) -> SamplerMethod:
        """The sampler method: ``"standard"``, ``"synthetic"`` or ``"fly"``."""
        return self.rule.method

    @classmethod
    def of(
        cls,
        config: RejectionSamplerConfig | None = None,
        method: str = "standard",
        rates: Sequence[float] | None = None,
        fly: FlyConfig | None = None,
    ) -> VerifyPlan:
        """The plan ``method`` runs with ``config`` (None: the defaults); ``ValueError`` naming what is
        wrong: an unknown method, flags the method cannot take, missing or unused parameters."""
        if method not in SAMPLER_METHODS:
            raise ValueError(
                f"unknown rejection sampler method {method!r}; allowed: {', '.join(SAMPLER_METHODS)}"
            )
        config = config if config is not None else RejectionSamplerConfig()
        rule = select_rule(config, method)
        return cls(rule, config, None if rates is None else tuple(rates), fly)

    @classmethod
    def resolve(
        cls, spec: SpeculativeConfig | None, config: RejectionSamplerConfig | None = None
    ) -> VerifyPlan:
        """The plan of a validated speculative config and the ``rejection_sampler_config`` flags: its
        ``rejection_sample_method`` (``block`` turns lossless block verification on), rates and FLy
        parameters. Without speculation (``spec=None``) the flags alone, with the standard method."""
        if spec is None:
            return cls.of(config)
        config = effective_rejection_sampler_config(spec, config)
        return cls.of(config, spec.sampler_method, spec.synthetic_acceptance_rates, spec.fly)


__all__ = ["SAMPLER_METHODS", "VerifyPlan"]
