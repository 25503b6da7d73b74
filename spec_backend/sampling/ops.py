"""``SamplerOps``: the kernels behind the rejection sampler, one method per kernel.

The granularity is chosen so that a triton implementation can match the torch reference
(``spec_backend.sampling.torch_ops.TorchSamplerOps``) method for method, and so that two
implementations can be compared "identical when fed the same uniforms":

* acceptance uniforms are explicit tensor arguments (made by ``uniforms``);
* per-vocabulary noise (recovered / bonus sampling) is generated *inside* ``sample_residual`` from
  (seed, position, ``rng.STREAM_SAMPLE``, vocabulary index) with ``spec_backend.sampling.rng``'s hash, so
  a kernel can make it in registers instead of reading a [T, V] noise tensor.

Conventions: T = draft tokens in the batch, B = requests, N = logits rows (T + B), V = vocabulary.
``cu_num_draft_tokens`` [B] is vLLM's inclusive cumulative sum of draft counts; request b's drafts are
``[cu[b] - K_b, cu[b])``. ``max_spec_len`` is a host int (max K_b). A draft id of -1 is a *null draft*
(a placeholder; the sampler maps every id outside [0, V) to -1 before calling the ops): q = 0 and ρ = 0,
so it is never accepted, and it is never used as an index. Counts of accepted drafts are int64.
Probabilities are float32; per-token scalars (ratios, block weights, uniforms, thresholds) are float64.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class SamplerOps(Protocol):
    """The kernels behind the rejection sampler on one device."""

    def target_probs(
        self,
        logits: torch.Tensor,  # [N, V] float
        temperature: torch.Tensor,  # [N] float32 (0 = greedy row: treated as 1)
        top_k: torch.Tensor,  # [N] int64 (0 or >= V: off)
        top_p: torch.Tensor,  # [N] float32 in (0, 1]
        apply_top_k: bool,
        apply_top_p: bool,
        max_top_k: int | None = None,  # host: largest k when every sampled row applies top-k
    ) -> torch.Tensor:  # [N, V] float32
        """Temperature, then top-k, then top-p; softmax. See ``spec_backend.sampling.probs``.
        ``max_top_k`` (``SamplingMetadata.max_top_k``) lets a kernel with a k limit decide on the host."""
        ...

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N] int64
        """Greedy tokens from the raw logits (first index on ties)."""
        ...

    def entropy_thresholds(
        self, logits: torch.Tensor, alpha: float, threshold: float
    ) -> torch.Tensor:  # [N, V] raw logits -> [N] float64
        """Entropy verify: τ = min(exp(−α·H(softmax(raw logits))), θ)."""
        ...

    def uniforms(
        self,
        seeds: torch.Tensor,  # [M] int64 >= 0
        positions: torch.Tensor,  # [M] int64
        counters: torch.Tensor,  # [M] int64
        stream: int,
    ) -> torch.Tensor:  # [M] float64 in [0, 1)
        """``rng.uniform_f64``: 53-bit uniforms keyed by (seed, position, stream, counter)."""
        ...

    def greedy_verify(
        self,
        draft_ids: torch.Tensor,  # [T] int
        target_argmax: torch.Tensor,  # [T] int64, argmax of each draft's target row
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
    ) -> torch.Tensor:  # [B] int64 accepted drafts
        """Accept while draft == argmax."""
        ...

    def standard_verify(
        self,
        draft_ids: torch.Tensor,  # [T] int
        draft_probs: torch.Tensor | None,  # [T, V] float (None: point-mass drafts)
        target_probs: torch.Tensor,  # [N, V] float32
        target_rows: torch.Tensor,  # [T] int, row of target_probs for each draft
        uniforms: torch.Tensor,  # [T] float64 in [0, 1)
        thresholds: torch.Tensor | None,  # [T] float64 entropy thresholds τ (None: plain)
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
    ) -> torch.Tensor:  # [B] int64 accepted drafts
        """Token-level test; the count is the leading run of accepted drafts. Without thresholds
        (lossless): accept x_i iff u_i < ρ_i = p_i(x_i)/q_i(x_i) (ρ = inf when q_i(x_i) = 0 < p_i(x_i)).
        With thresholds (vllm-ascend's rule, lossy): accept iff q_i(x_i) > 0 and p_i/q_i ≥ τ_i·u_i."""
        ...

    def cumulative_verify(
        self,
        draft_ids: torch.Tensor,  # [T] int
        draft_probs: torch.Tensor | None,  # [T, V] float
        target_probs: torch.Tensor,  # [N, V] float32
        target_rows: torch.Tensor,  # [T] int
        uniforms: torch.Tensor,  # [T] float64
        thresholds: torch.Tensor | None,  # [T] float64
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
    ) -> torch.Tensor:  # [B] int64 accepted drafts
        """vllm-ascend's block verification kernel (lossy): π_0 = 1, π_i = min(π_{i-1}·p_i(x_i)/q_i(x_i), 1)
        (NaN, from 0/0 or 0·inf, never passes); position i passes iff q_i(x_i) > 0 and
        π_i ≥ τ_i·Π_{j≤i} u_j (τ_i = 1 without thresholds: the current position's τ only); the count is the
        last passing position (0 if none): every draft up to it is accepted."""
        ...

    def block_verify(
        self,
        draft_ids: torch.Tensor,  # [T] int
        draft_probs: torch.Tensor | None,  # [T, V] float
        target_probs: torch.Tensor,  # [N, V] float32
        target_rows: torch.Tensor,  # [T] int
        uniforms: torch.Tensor,  # [T] float64: η_1..η_K of each request
        thresholds: torch.Tensor | None,  # [T] float64 (None: lossless; else ρ → ρ/τ, lossy)
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([B] int64 accepted drafts τ, [B] float64 weight b_τ)
        """Sun et al. 2024, Alg. 2. Returns τ and the weight b_τ that scales the residual."""
        ...

    def synthetic_verify(
        self,
        uniforms: torch.Tensor,  # [B] float64, one per request
        rates: torch.Tensor,  # [R] float64 non-increasing, R >= max_spec_len
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
    ) -> torch.Tensor:  # [B] int64 accepted drafts = #{i < K_b : u_b < rates[i]}
        """Synthetic acceptance for benchmarking."""
        ...

    def sample_residual(
        self,
        target_probs: torch.Tensor,  # [N, V] float32
        target_rows: torch.Tensor,  # [R] int, row of target_probs per output
        draft_probs: torch.Tensor | None,  # [T, V] float (None: point masses at draft_ids)
        draft_ids: torch.Tensor,  # [T] int
        draft_rows: torch.Tensor,  # [R] int, draft index per output; -1: no draft (q = 0, bonus)
        scale: torch.Tensor,  # [R] float64 weight b applied to p (1 for standard)
        seeds: torch.Tensor,  # [R] int64 >= 0
        positions: torch.Tensor,  # [R] int64 absolute position of the emitted token
    ) -> torch.Tensor:  # [R] int64 tokens
        """Sample from norm(max(b·p − q, 0)) (falls back to p when that mass is 0) by the exponential
        race argmax_v w_v / E_v, E_v = −log(u_v),
        u_v = rng.vocab_uniform_f32(seed, position, STREAM_SAMPLE)[v]; w in float32."""
        ...

    def tree_verify(
        self,
        parents: torch.Tensor,  # [B, M] int64: -1 the root, -2 past each request's nodes
        tokens: torch.Tensor,  # [B, M] int64
        target_probs: torch.Tensor,  # [N, V] float32
        target_argmax: torch.Tensor | None,  # [N] int64, argmax of the logits (None: no greedy request)
        row_start: torch.Tensor,  # [B] int64: the root's row; node i's is row_start + 1 + i
        greedy: torch.Tensor,  # [B] bool
        uniforms: torch.Tensor,  # [B, M + 1] float64: per node, then the final token's
        draft_probs: torch.Tensor | None = None,  # [B, M, V] f32: node i's q given its earlier siblings
    ) -> tuple[torch.Tensor, torch.Tensor]:  # path [B, M] int64 (-1 past), final [B] int64
        """Token trees by recursive rejection sampling (``sampling.tree_ops``): each request's accepted
        nodes, root to leaf, and the token emitted after them; every node a point mass without
        ``draft_probs``."""
        ...

    def gbv_verify(
        self,
        parents: torch.Tensor,  # [B, M] int64: the trie of ``paths`` draft paths (-2 past each request's)
        tokens: torch.Tensor,  # [B, M] int64
        target_probs: torch.Tensor,  # [N, V] float32
        target_argmax: torch.Tensor | None,  # [N] int64
        row_start: torch.Tensor,  # [B] int64
        greedy: torch.Tensor,  # [B] bool
        uniforms: torch.Tensor,  # [B, M + 1] float64
        draft_probs: torch.Tensor | None = None,  # [B, M, V]: the q node i was drawn from
        paths: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # path [B, M] int64 (-1 past), final [B] int64
        """Greedy multi-path block verification of i.i.d. draft paths (``sampling.gbv_ops``)."""
        ...


@runtime_checkable
class FusedVerifyOps(Protocol):
    """Optional, beside ``SamplerOps``: the whole verification of a batch in one call, without the [N, V]
    target probabilities, for the rules whose ``VerifyRule.fused`` is set and requests without top-k /
    top-p: ``"token"`` with or without draft probabilities, ``"block"`` for point-mass drafts only. The
    sampler uses it when ``fuses_verify()`` is True and otherwise composes the ``SamplerOps``; both give
    the same tokens (the block scan up to float32 near-ties, see ``triton.fused``)."""

    def fuses_verify(self) -> bool:
        """Whether ``fused_verify`` may be used (e.g. off for a tuning that disables it)."""
        ...

    def fused_verify(
        self,
        logits: torch.Tensor,  # [N, V] raw logits
        draft_probs: torch.Tensor | None,  # [T, V] (None: point-mass drafts)
        layout: tuple[torch.Tensor, ...],  # draft_ids [T], target_rows [T], bonus_rows [B], request [T],
        # slot [T], cu_num_draft_tokens [B] (draft ids outside [0, V) are null drafts)
        temperature: torch.Tensor,  # [B] (0: greedy)
        seeds: torch.Tensor,  # [B] int64 >= 0
        positions: torch.Tensor,  # [B] int64 absolute position of each request's first draft
        max_spec_len: int,
        rule: str,  # a VerifyRule.fused value: "token" or "block"
        sampled: bool,  # any request has temperature > 0
    ) -> torch.Tensor:  # [B, max_spec_len + 1] int32, the sampler's output
        """The sampler's output under ``rule``."""
        ...


class GreedyOutputOps(Protocol):
    """Optional, beside ``SamplerOps``: a batch whose requests are all greedy verified in one call. The
    sampler uses it where the ops have it, for every rule but synthetic acceptance and FLy (for greedy
    rows every other rule is argmax matching), and otherwise composes the ``SamplerOps``; both give the
    same output, exactly (``tests/unit/test_cpu_sampler_ops.py``)."""

    def greedy_output(
        self,
        logits: torch.Tensor,  # [N, V]
        draft_ids: torch.Tensor,  # [T] (ids outside [0, V) are null drafts)
        target_rows: torch.Tensor,  # [T] the logits row verifying each draft
        bonus_rows: torch.Tensor,  # [B]
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
    ) -> torch.Tensor:  # [B, max_spec_len + 1] int32, the sampler's output
        """Each request's drafts accepted while each equals ``torch.argmax`` of its target row (a null
        draft ends them), then the argmax of the row after the last accepted draft (the bonus row after
        all of them), then ``PLACEHOLDER_TOKEN_ID``."""
        ...


__all__ = ["FusedVerifyOps", "GreedyOutputOps", "SamplerOps"]
