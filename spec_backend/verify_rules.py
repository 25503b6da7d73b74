"""The registry of verification rules: the one place that says which rules exist and what they are.

Every reader derives its vocabulary from ``REGISTRY``: ``RejectionSampler.mode_name`` / ``lossless`` and
its kernel dispatch, ``RejectionSamplerConfig.lossless``, the conformance suite's ``MODES`` and the float64
spec's ``RULES`` / ``LOSSLESS_RULES`` (``spec_backend.testing``). Each ``VerifyRule`` has

* ``name`` — the rule's one name: the sampler's ``mode_name`` and the rule's name in the float64 spec
  (``standard``, ``block-lossless``, ``block-cumulative``, ``entropy``, ``block-lossless+entropy``,
  ``block-cumulative+entropy``, ``synthetic``, ``fly``);
* ``spec`` — whether ``spec_backend.testing.spec`` has a float64 law of the rule (every rule but FLy);
* ``lossless`` — whether the emitted stream keeps the target's distribution;
* the selector: the sampler ``method`` and the ``RejectionSamplerConfig`` flags (``block``: the
  ``block_verify_mode`` with block verification on, None with it off; ``entropy``) that pick the rule,
  tested by ``selects(config, method)``;
* ``kernel`` — which ``SamplerOps`` method verifies the drafts (a function of the ops, never a getattr by
  name); None for ``synthetic``, whose accept counts come from configured rates
  (``SamplerOps.synthetic_verify``), not from comparing drafts with the target;
* ``fused`` — whether an ops with ``FusedVerifyOps`` may run the whole verification without the target
  probabilities, requests without top-k / top-p: ``"token"`` (the token-level chain, which needs only
  p(x) and q(x) per draft: with or without draft probabilities) or ``"block"`` (Sun et al.'s scan:
  point-mass drafts only); None where the rule needs more (thresholds, rates, rescues).

Token trees have their own rules (``TREE_REGISTRY``: ``TreeRule``), read the same way by the engine's
tree step and the float64 law of ``spec_backend.testing.tree_spec``.

Greedy requests (temperature 0) are not a rule: they are verified by argmax inside every rule except
``synthetic``. This module imports no torch kernels and nothing from ``spec_backend.config`` at run
time, so the config layer can read it without an import cycle.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypedDict

if TYPE_CHECKING:
    import torch

    from spec_backend.sampling.ops import SamplerOps

    #: (draft_ids [T], draft_probs [T, V] | None, target_probs [N, V], target_rows [T], uniforms [T] f64,
    #: thresholds [T] f64 | None, cu_num_draft_tokens [B], max_spec_len) -> (accepted [B] int64,
    #: residual weight [B] float64, or None for a weight of 1)
    DraftVerify = Callable[
        [
            torch.Tensor,
            torch.Tensor | None,
            torch.Tensor,
            torch.Tensor,
            torch.Tensor,
            torch.Tensor | None,
            torch.Tensor,
            int,
        ],
        tuple[torch.Tensor, torch.Tensor | None],
    ]
    KernelSelector = Callable[[SamplerOps], DraftVerify]
    #: (parents [B, M], tokens [B, M], target_probs [N, V], target_argmax [N] | None, row_start [B],
    #: greedy [B], uniforms [B, M + 1] f64, draft_probs [B, M, V] | None) -> (path [B, M], final [B]):
    #: ``SamplerOps.tree_verify``
    TreeVerify = Callable[
        [
            torch.Tensor,
            torch.Tensor,
            torch.Tensor,
            torch.Tensor | None,
            torch.Tensor,
            torch.Tensor,
            torch.Tensor,
            torch.Tensor | None,
        ],
        tuple[torch.Tensor, torch.Tensor],
    ]

#: the ``RejectionSampler``'s ``method``: which family of rules verifies (``rejection_sample_method`` names
#: map onto these in ``spec_backend.config.sampler_methods``)
SamplerMethod = Literal["standard", "synthetic", "fly"]
ModeName = Literal[
    "standard",
    "block-lossless",
    "block-cumulative",
    "entropy",
    "block-lossless+entropy",
    "block-cumulative+entropy",
    "synthetic",
    "fly",
]
BlockMode = Literal["lossless", "cumulative"]

#: vllm-ascend verifies a batch with its cumulative block rule only when the longest draft block has at
#: least this many drafts; shorter batches take its token-level rule (vllm_ascend/sample/rejection_sampler.py)
CUMULATIVE_MIN_SPEC_LEN = 3


class ConfigFlags(TypedDict):
    """``RejectionSamplerConfig`` keyword arguments that select a rule (``VerifyRule.config_flags``)."""

    enable_block_verify: bool
    block_verify_mode: BlockMode
    enable_entropy_verify: bool


class VerifyFlags(Protocol):
    """The ``RejectionSamplerConfig`` fields that select a rule."""

    @property
    def enable_block_verify(self) -> bool: ...

    @property
    def block_verify_mode(self) -> str: ...

    @property
    def enable_entropy_verify(self) -> bool: ...


def token_level(ops: SamplerOps) -> DraftVerify:
    """``SamplerOps.standard_verify``: the token-level test (with thresholds, vllm-ascend's rule)."""
    return lambda *args: (ops.standard_verify(*args), None)


def cumulative_block(ops: SamplerOps) -> DraftVerify:
    """``SamplerOps.cumulative_verify``: vllm-ascend's cumulative block rule."""
    return lambda *args: (ops.cumulative_verify(*args), None)


def lossless_block(ops: SamplerOps) -> DraftVerify:
    """``SamplerOps.block_verify``: Sun et al. 2024, Alg. 2 (returns the residual weight too)."""
    return lambda *args: ops.block_verify(*args)


@dataclass(frozen=True)
class VerifyRule:
    """One verification rule (see the module docstring for the fields)."""

    name: ModeName
    spec: bool
    lossless: bool
    method: SamplerMethod
    block: BlockMode | None
    entropy: bool
    kernel: KernelSelector | None
    fused: Literal["token", "block"] | None = None

    def selects(self, config: VerifyFlags, method: str) -> bool:
        """Whether ``method`` with ``config`` runs this rule (``block_verify_mode`` counts only with
        block verification on)."""
        block = config.block_verify_mode if config.enable_block_verify else None
        return (method, block, config.enable_entropy_verify) == (self.method, self.block, self.entropy)

    def config_flags(self) -> ConfigFlags:
        """``RejectionSamplerConfig`` keyword arguments that select this rule (with its method)."""
        return ConfigFlags(
            enable_block_verify=self.block is not None,
            block_verify_mode=self.block or "lossless",
            enable_entropy_verify=self.entropy,
        )

    def token_fallback(self, max_spec_len: int) -> bool:
        """Whether a batch whose longest draft block is ``max_spec_len`` takes vllm-ascend's token-level
        rule instead: the cumulative rules do below ``CUMULATIVE_MIN_SPEC_LEN``, as vllm-ascend does."""
        return self.block == "cumulative" and max_spec_len < CUMULATIVE_MIN_SPEC_LEN

    def kernel_for(self, max_spec_len: int) -> KernelSelector | None:
        """The kernel for a batch whose longest draft block is ``max_spec_len`` (see ``token_fallback``)."""
        return token_level if self.token_fallback(max_spec_len) else self.kernel


def _rule(
    name: ModeName,
    lossless: bool,
    kernel: KernelSelector | None,
    method: SamplerMethod = "standard",
    block: BlockMode | None = None,
    entropy: bool = False,
    fused: Literal["token", "block"] | None = None,
    spec: bool = True,
) -> VerifyRule:
    return VerifyRule(name, spec, lossless, method, block, entropy, kernel, fused)


#: Every rule, in the order the conformance suite and the docs list them.
REGISTRY: tuple[VerifyRule, ...] = (
    _rule("standard", True, token_level, fused="token"),
    _rule("block-lossless", True, lossless_block, block="lossless", fused="block"),
    _rule("block-cumulative", False, cumulative_block, block="cumulative"),
    _rule("entropy", False, token_level, entropy=True),
    _rule("block-lossless+entropy", False, lossless_block, block="lossless", entropy=True),
    _rule("block-cumulative+entropy", False, cumulative_block, block="cumulative", entropy=True),
    _rule("synthetic", False, None, method="synthetic"),
    _rule("fly", False, token_level, method="fly", spec=False),
)
RULES_BY_NAME: dict[str, VerifyRule] = {rule.name: rule for rule in REGISTRY}


def select_rule(config: VerifyFlags, method: str = "standard") -> VerifyRule:
    """The rule ``method`` runs with ``config``; ``ValueError`` naming the combination when none does."""
    for rule in REGISTRY:
        if rule.selects(config, method):
            return rule
    methods = sorted({rule.method for rule in REGISTRY})
    if method not in methods:
        raise ValueError(f"unknown rejection sampler method {method!r}; allowed: {', '.join(methods)}")
    raise ValueError(
        f"method={method!r} cannot be combined with enable_block_verify / enable_entropy_verify "
        f"(got enable_block_verify={config.enable_block_verify}, "
        f"enable_entropy_verify={config.enable_entropy_verify}): it has its own acceptance rule; "
        "only method='standard' takes them"
    )


def rule_named(name: str) -> VerifyRule:
    """The rule whose ``mode_name`` is ``name``; ``ValueError`` listing the names otherwise."""
    if name not in RULES_BY_NAME:
        raise ValueError(f"unknown verification rule {name!r}; known: {list(RULES_BY_NAME)}")
    return RULES_BY_NAME[name]


# --------------------------------------------------------------------------------- token trees


@dataclass(frozen=True)
class TreeRule:
    """A token-tree verification rule (#42): ``name`` — its name in the float64 law
    (``spec_backend.testing.tree_spec``; ``testing.gbv_spec`` for ``paths`` rules); ``lossless``;
    ``draft_probs`` — whether it reads the distributions the nodes were drawn from (passed to the kernel;
    else ``None``: every node is judged as a point mass); ``kernel`` — the ``SamplerOps`` method that runs
    it, given the ops and the number of draft paths (None: specified only — a lossy negative control the
    tests must reject); ``paths`` — whether it verifies ``K`` i.i.d. draft paths merged into a trie
    (multi-path verification) rather than a tree of siblings."""

    name: str
    lossless: bool
    draft_probs: bool
    kernel: Callable[[SamplerOps, int], TreeVerify] | None
    paths: bool = False


def recursive_rejection_tree(ops: SamplerOps, paths: int) -> TreeVerify:
    """``SamplerOps.tree_verify``: recursive rejection sampling over the siblings, with their draft
    distributions (``rrs``) or as point masses (``point_mass``: ``draft_probs`` None); ``paths`` unused."""
    del paths
    return ops.tree_verify


def greedy_multi_path_block(ops: SamplerOps, paths: int) -> TreeVerify:
    """``SamplerOps.gbv_verify`` for ``paths`` i.i.d. draft paths: greedy multi-path block verification
    (Thomas & Pal, arXiv 2602.16961; ``spec_backend.testing.gbv_spec``)."""
    return functools.partial(ops.gbv_verify, paths=paths)


#: every tree rule: ``rrs`` (recursive rejection sampling with the siblings' draft distributions: sampled
#: siblings), ``point_mass`` (what the engine's trees run: their nodes are top tokens), ``gbv`` (greedy
#: multi-path block verification of i.i.d. draft paths), and the negative controls (``gbv_unskewed``: the
#: selected path verified with the draft's own law, as if it had been drawn alone)
TREE_REGISTRY: tuple[TreeRule, ...] = (
    TreeRule("rrs", True, True, recursive_rejection_tree),
    TreeRule("point_mass", True, False, recursive_rejection_tree),
    TreeRule("naive_iid", False, True, None),
    TreeRule("no_residual", False, True, None),
    TreeRule("gbv", True, True, greedy_multi_path_block, paths=True),
    TreeRule("gbv_unskewed", False, True, None, paths=True),
)


def tree_rule(name: str) -> TreeRule:
    """The tree rule named ``name``; ``ValueError`` listing the names otherwise."""
    for rule in TREE_REGISTRY:
        if rule.name == name:
            return rule
    raise ValueError(f"unknown token-tree rule {name!r}; known: {[r.name for r in TREE_REGISTRY]}")


__all__ = [
    "CUMULATIVE_MIN_SPEC_LEN",
    "REGISTRY",
    "RULES_BY_NAME",
    "TREE_REGISTRY",
    "BlockMode",
    "ConfigFlags",
    "ModeName",
    "SamplerMethod",
    "TreeRule",
    "VerifyFlags",
    "VerifyRule",
    "cumulative_block",
    "greedy_multi_path_block",
    "lossless_block",
    "recursive_rejection_tree",
    "rule_named",
    "select_rule",
    "token_level",
    "tree_rule",
]
