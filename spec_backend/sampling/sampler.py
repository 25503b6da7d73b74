"""``RejectionSampler``: verifies a batch of draft blocks against the target model's logits.

Modes (``mode_name``: the entries of ``spec_backend.verify_rules.REGISTRY``, which also says which
``SamplerOps`` method runs each):

* ``standard`` — token-level speculative sampling; lossless.
* ``block-lossless`` — Sun et al. 2024 (arXiv 2403.10444, Alg. 2); lossless, never fewer expected
  tokens than ``standard`` (equal for point-mass drafts).
* ``block-cumulative`` — vllm-ascend's block verification kernel, reproduced exactly: π_i =
  min(π_{i−1}·ρ_i, 1); position i passes iff q_i(x_i) > 0 and π_i ≥ Π_{j≤i} u_j; every draft up to the
  *last* passing position is accepted. As in vllm-ascend it runs only when the batch's longest draft block
  has K ≥ 3 (``CUMULATIVE_MIN_SPEC_LEN``); shorter batches take vllm-ascend's token-level rule
  (accept iff q(x) > 0 and ρ ≥ u). **Lossy**.
* ``entropy`` / ``block-cumulative+entropy`` — vllm-ascend's entropy verify, exactly: τ_i =
  min(exp(−α·H_i), θ) with H_i = −Σ p·ln(p + 1e−10) over the softmax of the raw target logits;
  token-level: accept iff q_i(x_i) > 0 and ρ_i ≥ τ_i·u_i; cumulative: π_i ≥ τ_i·Π_{j≤i} u_j (the current
  position's τ only). **Lossy**.
* ``block-lossless+entropy`` — lossless block verification with the weights b_i = min(1, b_{i−1}·ρ_i/τ_i)
  (ours, not a vllm-ascend mode); **lossy**; with α = 0 and θ = 1 it reduces exactly to
  ``block-lossless``.
* ``synthetic`` — accept counts from configured rates (benchmarking); **lossy**.

Greedy requests (temperature 0) are always verified by argmax (bit-exact with argmax decoding), in
every mode except ``synthetic``, whose accept count applies to all requests.

Randomness: see ``spec_backend.sampling.rng``. Acceptance uniforms of a step are keyed by (seed,
first draft position, ``STREAM_ACCEPT``, slot); the recovered/bonus token's noise by (seed, absolute
position of that token, ``STREAM_SAMPLE``, vocab id). Step keys never repeat because every step emits
at least one token, so uniforms observed by one step (block verification looks at all of them) are
never reused by the next.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from spec_backend.config.fly import FlyConfig
from spec_backend.config.rejection import RejectionSamplerConfig
from spec_backend.config.verify_plan import SAMPLER_METHODS, VerifyPlan
from spec_backend.sampling import rng
from spec_backend.sampling.errors import SamplerInputError
from spec_backend.sampling.fly import fly_rescues
from spec_backend.sampling.fused_verify import fused_output
from spec_backend.sampling.grouping import merge_outputs, split_batch
from spec_backend.sampling.layout import VerifyStep
from spec_backend.sampling.metadata import SpecDecodeMetadata
from spec_backend.sampling.ops import SamplerOps
from spec_backend.sampling.output import bonus_only, build_output, row_target_probs
from spec_backend.sampling.sampling_metadata import SamplingMetadata
from spec_backend.sampling.torch_ops import TorchSamplerOps
from spec_backend.sampling.tuning import MAX_SPEC_TOKENS, SamplerBackend, SamplerTuning
from spec_backend.sampling.validation import check_inputs, check_values
from spec_backend.verify_rules import CUMULATIVE_MIN_SPEC_LEN, SamplerMethod, VerifyRule

logger = logging.getLogger("spec_backend.sampling")

#: the sampler's methods: the one list of them is ``verify_rules.SamplerMethod``
METHODS: tuple[str, ...] = SAMPLER_METHODS
#: the name in error messages of a sampler built without a backend
REFERENCE_OPS = "torch reference ops"
_WARNED: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning(message, *args)


def _check_backend(backend: object) -> SamplerBackend | None:
    """``backend`` as a ``SamplerBackend`` (None stays None); ``TypeError`` for anything else."""
    if backend is None or isinstance(backend, SamplerBackend):
        return backend
    if isinstance(backend, str):
        raise TypeError(
            f"RejectionSampler(backend={backend!r}): a backend name is not accepted; pass a Backend object, "
            f"e.g. backend=spec_backend.backends.load_backend({backend!r}), or backend=None for the "
            "pure-torch reference ops"
        )
    raise TypeError(
        f"RejectionSampler(backend=...) needs an object with name, sampler_ops(), sampler_tuning() and "
        f"token_limits() (spec_backend.sampling.tuning.SamplerBackend, e.g. a Backend) or None, "
        f"got {type(backend).__name__}: {backend!r}"
    )


def _refuse_beside_plan(**given: object) -> None:
    """``ValueError`` naming the rule arguments passed beside a ``plan``, which carries them itself."""
    named = [name for name, value in given.items() if value is not None]
    if named:
        raise ValueError(
            "RejectionSampler(plan=...) takes the rule and its parameters from the plan; got "
            f"{', '.join(named)} beside it (put them in the plan: VerifyPlan.of(config, method, rates, fly))"
        )


class RejectionSampler:
    """``sampler(metadata, draft_probs [T, V] | None, logits [T+B, V], sampling) -> [B, max_K+1] int32``.

    Row b of the output holds request b's accepted drafts, then its recovered or bonus token, padded
    with ``PLACEHOLDER_TOKEN_ID``. ``draft_probs`` are the drafter's already processed probabilities
    (temperature / top-k / top-p applied by the drafter); None means point-mass drafts.
    ``debug=True`` adds checks that read the data back (NaN in logits, draft ids outside [0, V) when
    the metadata was not built from Python lists): one pass over the logits and a device sync per call.
    ``backend``: any ``SamplerBackend`` (every ``spec_backend.backends.Backend``; get one by name with
    ``spec_backend.backends.load_backend(name)``); None runs the pure-torch reference ops
    (``TorchSamplerOps``) with the default ``SamplerTuning``. The sampler never runs plugin discovery.

    The rule and its parameters: ``config``, ``method`` and the rule's own parameters
    (``synthetic_acceptance_rates``, ``fly``), or one resolved ``plan=VerifyPlan`` (what the engine
    passes: ``spec_backend.config.verify_plan``), not both.
    """

    def __init__(
        self,
        config: RejectionSamplerConfig | None = None,
        method: str = "standard",
        backend: SamplerBackend | None = None,
        synthetic_acceptance_rates: Sequence[float] | None = None,
        debug: bool = False,
        fly: FlyConfig | None = None,
        *,
        plan: VerifyPlan | None = None,
    ) -> None:
        if plan is None:
            plan = VerifyPlan.of(config, method, synthetic_acceptance_rates, fly)
        else:
            method_given = None if method == "standard" else method
            _refuse_beside_plan(
                config=config,
                method=method_given,
                synthetic_acceptance_rates=synthetic_acceptance_rates,
                fly=fly,
            )
        #: the verification rule (``spec_backend.verify_rules``) with its parameters
        self.plan: VerifyPlan = plan
        self.debug = debug
        self._rates = None if plan.rates is None else torch.tensor(plan.rates, dtype=torch.float64)  # [R]
        self._rates_cache: dict[torch.device, torch.Tensor] = {}
        self.backend = _check_backend(backend)
        if self.backend is None:
            self.ops: SamplerOps = TorchSamplerOps()
            tuning, self.max_spec_tokens, self.backend_name = SamplerTuning(), MAX_SPEC_TOKENS, REFERENCE_OPS
        else:
            self.ops = self.backend.sampler_ops()
            tuning = self.backend.sampler_tuning()
            self.max_spec_tokens = self.backend.token_limits().max_speculative_tokens
            self.backend_name = self.backend.name
        self.group_elements: int | None = tuning.group_elements
        if not self.lossless:
            _warn_once(
                self.mode_name,
                "rejection sampler mode %r is LOSSY: its output distribution differs from the target "
                "model's (use it for compatibility or benchmarking only)",
                self.mode_name,
            )

    @property
    def config(self) -> RejectionSamplerConfig:
        """The flags that select the rule, and the entropy rule's θ and α."""
        return self.plan.config

    @property
    def method(self) -> SamplerMethod:
        return self.plan.method

    @property
    def rule(self) -> VerifyRule:
        """The verification rule (``spec_backend.verify_rules.REGISTRY``) the sampler runs."""
        return self.plan.rule

    @property
    def fly(self) -> FlyConfig | None:
        """FLy's parameters (``method="fly"`` only)."""
        return self.plan.fly

    @property
    def mode_name(self) -> str:
        """The rule's name in ``spec_backend.verify_rules.REGISTRY``."""
        return self.rule.name

    @property
    def lossless(self) -> bool:
        """Whether the rule keeps the target's distribution (``VerifyRule.lossless``)."""
        return self.rule.lossless

    def __repr__(self) -> str:
        return f"RejectionSampler(mode={self.mode_name!r}, lossless={self.lossless})"

    def __call__(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        sampling: SamplingMetadata,
    ) -> torch.Tensor:
        return self.forward(metadata, draft_probs, logits, sampling)

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,  # [T, V]
        logits: torch.Tensor,  # [T + B, V]
        sampling: SamplingMetadata,
    ) -> torch.Tensor:  # [B, max_spec_len + 1] int32
        check_inputs(metadata, draft_probs, logits, sampling, self.max_spec_tokens, self.backend_name)
        if self._rates is not None and metadata.max_spec_len > self._rates.numel():
            raise SamplerInputError(
                f"a request has K={metadata.max_spec_len} draft tokens but synthetic_acceptance_rates has "
                f"only {self._rates.numel()} entries"
            )
        if self.debug:
            check_values(metadata, draft_probs, logits)
        batch = metadata.batch_size
        if batch == 0:
            return torch.empty(0, metadata.max_spec_len + 1, dtype=torch.int32, device=logits.device)
        budget = self.group_elements
        if budget is not None and batch > 1 and not sampling.all_greedy and logits.numel() > budget:
            return self._verify_in_groups(metadata, draft_probs, logits, sampling, budget)
        return self._verify_batch(metadata, draft_probs, logits, sampling)

    def _verify_in_groups(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,  # [T, V]
        logits: torch.Tensor,  # [T + B, V]
        sampling: SamplingMetadata,
        group_elements: int,
    ) -> torch.Tensor:  # [B, max_spec_len + 1] int32
        """The same output as one pass (see ``grouping``), from groups of requests of bounded size."""
        seeds, positions = self._seeds_and_positions(sampling, metadata.batch_size, logits.device)
        groups = split_batch(metadata, draft_probs, logits, sampling, seeds, positions, group_elements)
        outputs = [
            (g.first, self._verify_batch(g.metadata, g.draft_probs, g.logits, g.sampling)) for g in groups
        ]
        return merge_outputs(outputs, metadata.batch_size, metadata.max_spec_len, logits.device)

    def _verify_batch(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,  # [T, V]
        logits: torch.Tensor,  # [T + B, V]
        sampling: SamplingMetadata,
    ) -> torch.Tensor:  # [B, max_spec_len + 1] int32
        seeds, positions = self._seeds_and_positions(sampling, metadata.batch_size, logits.device)
        fused = fused_output(self.ops, self.rule, metadata, draft_probs, logits, sampling, seeds, positions)
        if fused is not None:
            return fused
        if metadata.max_spec_len == 0 and self._rates is None:  # plain decoding: the bonus rows alone
            return bonus_only(self.ops, metadata.bonus_logits_indices, logits, sampling, seeds, positions)
        greedy = getattr(self.ops, "greedy_output", None)  # GreedyOutputOps (getattr: see fused_output)
        if greedy is not None and sampling.all_greedy and self._rates is None and self.fly is None:
            rows = (metadata.target_logits_indices, metadata.bonus_logits_indices)
            out: torch.Tensor = greedy(
                logits, metadata.draft_token_ids, *rows, metadata.cu_num_draft_tokens, metadata.max_spec_len
            )
            return out
        step = VerifyStep.of(metadata, logits.shape[1], seeds, positions)
        greedy_rows = sampling.temperature == 0  # [B]
        argmax = None if sampling.all_random else self.ops.argmax(logits)  # [N]
        probs = None
        if not sampling.all_greedy:
            row_req = self._row_requests(
                step.target_rows, step.bonus_rows, step.req_of, logits.shape[0]
            )  # [N]
            probs = row_target_probs(self.ops, logits, sampling, row_req)  # [N, V]
        num_accepted, scale = self._accept_counts(step, draft_probs, logits, probs, argmax, greedy_rows)
        num_accepted = torch.minimum(num_accepted, step.first_null)  # a placeholder ends the drafts
        cu, total = step.cu.to(torch.int64), step.draft_ids.shape[0]
        counts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])  # [B]
        is_bonus = num_accepted >= counts  # [B]
        final_rows, draft_rows = step.bonus_rows, torch.full_like(step.bonus_rows, -1)  # [B], [B]
        if total:
            draft_at = torch.clamp(cu - counts + num_accepted, max=total - 1)  # [B]
            final_rows = torch.where(is_bonus, step.bonus_rows, step.target_rows[draft_at])
            no_draft = is_bonus | step.null[draft_at] | (self._rates is not None)  # q = 0 at these rows
            draft_rows = torch.where(no_draft, torch.full_like(draft_at, -1), draft_at)
        final = torch.zeros(step.batch, dtype=torch.int64, device=logits.device)  # [B]
        if probs is not None:
            final = self.ops.sample_residual(
                probs, final_rows, draft_probs, step.draft_ids, draft_rows, scale, step.seeds,
                step.positions + num_accepted,
            )  # fmt: skip
        if argmax is not None:
            final = (
                torch.where(greedy_rows, argmax[final_rows], final)
                if probs is not None
                else argmax[final_rows]
            )
        return build_output(step.draft_ids, step.cu, num_accepted, final, step.steps)

    def _accept_counts(
        self,
        step: VerifyStep,
        draft_probs: torch.Tensor | None,  # [T, V]
        logits: torch.Tensor,  # [N, V]
        probs: torch.Tensor | None,  # [N, V] processed target (None: every request greedy)
        argmax: torch.Tensor | None,  # [N] (None: no greedy request)
        greedy_rows: torch.Tensor,  # [B] bool
    ) -> tuple[torch.Tensor, torch.Tensor]:  # accepted drafts [B] int64, residual weight [B] float64
        ops, device = self.ops, logits.device
        scale = torch.ones(step.batch, dtype=torch.float64, device=device)  # [B]
        if self._rates is not None:
            u_req = ops.uniforms(
                step.seeds, step.positions, torch.zeros_like(step.seeds), rng.STREAM_SYNTHETIC
            )
            return ops.synthetic_verify(u_req, self._rates_on(device), step.cu, step.steps), scale
        target_argmax = None if argmax is None else argmax[step.target_rows]  # [T]
        u: torch.Tensor | None = None  # [T]
        if probs is not None:
            u = ops.uniforms(
                step.seeds[step.req_of], step.positions[step.req_of], step.slot_of, rng.STREAM_ACCEPT
            )
        if self.fly is not None and step.draft_ids.numel():
            layout = (step.cu, step.steps, step.req_of, step.slot_of)
            rescue = fly_rescues(
                self.fly, step.draft_ids, draft_probs, logits, probs, step.target_rows,
                greedy_rows[step.req_of], target_argmax, u, layout,
            )  # fmt: skip  # [T]
            if target_argmax is not None:  # a rescued greedy draft counts as the argmax
                target_argmax = torch.where(rescue, step.draft_ids.to(torch.int64), target_argmax)
            if u is not None:  # a rescued sampled draft gets u = 0: the native rule accepts it
                u = torch.where(rescue, torch.zeros_like(u), u)
        num_accepted = torch.zeros(step.batch, dtype=torch.int64, device=device)  # [B]
        if target_argmax is not None:
            num_accepted = ops.greedy_verify(step.draft_ids, target_argmax, step.cu, step.steps)
        if probs is None or u is None:
            return num_accepted, scale
        n_random, scale = self._verify_random(step, draft_probs, logits, probs, u)
        return (
            torch.where(greedy_rows, num_accepted, n_random) if target_argmax is not None else n_random
        ), scale

    def _verify_random(
        self,
        step: VerifyStep,
        draft_probs: torch.Tensor | None,  # [T, V]
        logits: torch.Tensor,  # [N, V]
        probs: torch.Tensor,  # [N, V]
        u: torch.Tensor,  # [T] float64 acceptance uniforms
    ) -> tuple[torch.Tensor, torch.Tensor]:  # accepted [B] int64, residual weight [B] float64
        ops, cfg, rule = self.ops, self.config, self.rule
        kernel = rule.kernel_for(step.steps)
        assert kernel is not None, f"rule {rule.name!r} does not verify drafts against the target"
        thresholds = None  # [T] float64
        if rule.entropy:
            thresholds = ops.entropy_thresholds(logits, cfg.posterior_alpha, cfg.posterior_threshold)[
                step.target_rows
            ]
        if rule.token_fallback(step.steps) and thresholds is None:
            thresholds = torch.ones_like(u)  # vllm-ascend's token-level rule (q > 0 and ρ >= u)
        accepted, weight = kernel(ops)(
            step.draft_ids, draft_probs, probs, step.target_rows, u, thresholds, step.cu, step.steps
        )  # [B] int64, [B] float64 | None
        if weight is None:
            weight = torch.ones(step.batch, dtype=torch.float64, device=u.device)
        return accepted, weight

    def _rates_on(self, device: torch.device) -> torch.Tensor:  # [R] float64, copied once per device
        assert self._rates is not None
        if device not in self._rates_cache:
            self._rates_cache[device] = self._rates.to(device)
        return self._rates_cache[device]

    @staticmethod
    def _row_requests(
        target_rows: torch.Tensor, bonus_rows: torch.Tensor, req_of: torch.Tensor, num_rows: int
    ) -> torch.Tensor:  # [N] int64 request of each logits row
        rows = torch.zeros(num_rows, dtype=torch.int64, device=bonus_rows.device)
        rows = rows.scatter(0, target_rows, req_of.to(torch.int64))
        return rows.scatter(0, bonus_rows, torch.arange(bonus_rows.shape[0], device=bonus_rows.device))

    def _seeds_and_positions(
        self, sampling: SamplingMetadata, batch: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fresh = rng.random_seeds(batch, device)  # [B] unseeded requests: new seed per call
        seeds = fresh if sampling.seeds is None else torch.where(sampling.seeds >= 0, sampling.seeds, fresh)
        if sampling.positions is None:
            if sampling.has_seeds:
                _warn_once(
                    "positions",
                    "SamplingMetadata has seeds but no positions: every step of a seeded request reuses "
                    "the same random numbers; pass positions (absolute position of the first draft token)",
                )
            return seeds, torch.zeros(batch, dtype=torch.int64, device=device)
        return seeds, sampling.positions.to(torch.int64)


__all__ = ["CUMULATIVE_MIN_SPEC_LEN", "METHODS", "REFERENCE_OPS", "RejectionSampler"]
