# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""``SamplerOps.tree_verify`` in triton: one program per request walks its point-mass tree
(``sampling.tree_ops`` has the rule and the layout; this kernel follows it step for step).

Per level the program scans the ``M`` node slots for the current node's children (a child repeating an
earlier sibling's token is marked on the host side, ``repeated_siblings``), then descends or stops; at the
end the final token is drawn by two vocabulary passes over the residual mass (total, then the first
crossing of ``u_final`` of it). Greedy requests compare with ``target_argmax`` instead. Scalars are
float64 with ``F64`` (CUDA), float32 otherwise; decisions match the torch op except where a comparison is
within rounding of a tie (the blocked vocabulary sums differ from torch's sequential ones in the last
bits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from spec_backend.sampling.tree_ops import repeated_siblings
from spec_backend.sampling.triton.tree_common import _crossing, _target_argmax
from spec_backend.sampling.triton.tree_sampled import tree_verify_sampled
from spec_backend.sampling.triton.verify import _scalar
from spec_backend.sampling.tuning import SamplerTuning


@triton.jit
def _residual_block(
    probs_ptr, row, p_stride, v0, V, parents_ptr, tokens_ptr, base, node, M, BLOCK_V: tl.constexpr
):
    """One vocabulary block of row ``row`` with the children of ``node`` (all rejected) removed."""
    idx = v0 + tl.arange(0, BLOCK_V)
    live = idx < V
    mass = tl.load(probs_ptr + row * p_stride + idx, mask=live, other=0.0)
    for c in range(0, M):
        child = tl.load(parents_ptr + base + c) == node
        token = tl.load(tokens_ptr + base + c)
        mass = tl.where(child & (idx == token), 0.0, mass)
    return idx, live, mass


@triton.jit
def _residual_sample(
    probs_ptr,
    row,
    p_stride,
    V,
    parents_ptr,
    tokens_ptr,
    base,
    node,
    M,
    u,
    zero,
    F64: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """The first token whose running residual mass exceeds ``u`` of the total (two vocabulary passes; the
    last token of positive mass where rounding leaves none)."""
    total = zero
    for v0 in range(0, V, BLOCK_V):
        _, _, mass = _residual_block(
            probs_ptr, row, p_stride, v0, V, parents_ptr, tokens_ptr, base, node, M, BLOCK_V
        )
        total += tl.sum(_scalar(mass, F64), axis=0)
    threshold = u * total
    running = zero
    chosen = tl.zeros((), tl.int64) - 1
    last = tl.zeros((), tl.int64) - 1
    for v0 in range(0, V, BLOCK_V):
        idx, live, mass = _residual_block(
            probs_ptr, row, p_stride, v0, V, parents_ptr, tokens_ptr, base, node, M, BLOCK_V
        )
        chosen, last, running = _crossing(idx, live, _scalar(mass, F64), running, threshold, chosen, last, V)
    return tl.where(chosen >= 0, chosen, last)


@triton.jit
def tree_verify_kernel(
    parents_ptr,  # [B, M] int64 (-1 root, -2 padding)
    tokens_ptr,  # [B, M] int64
    dup_ptr,  # [B, M] int8: repeats an earlier sibling's token
    probs_ptr,  # [N, V] float32
    p_stride,
    argmax_ptr,  # [N] int64 (unused without HAS_ARGMAX)
    start_ptr,  # [B] int64
    greedy_ptr,  # [B] int8
    u_ptr,  # [B, M + 1] float64 / float32
    path_ptr,  # [B, M] int64 out, prefilled with -1
    final_ptr,  # [B] int64 out
    M,
    V,
    HAS_ARGMAX: tl.constexpr,
    F64: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * M
    start = tl.load(start_ptr + b).to(tl.int64)
    greedy = tl.load(greedy_ptr + b) != 0
    zero = _scalar(tl.zeros((), tl.float32), F64)
    node = tl.zeros((), tl.int64) - 1
    depth = tl.zeros((), tl.int64)
    stopped = node > 0
    for _level in range(0, M):
        row = start + 1 + node
        best = _target_argmax(argmax_ptr, row, greedy, HAS_ARGMAX)
        accepted = tl.zeros((), tl.int64) - 1
        mass = zero  # S: the rejected tokens' probability
        for c in range(0, M):
            child = (tl.load(parents_ptr + base + c) == node) & (accepted < 0) & (stopped == 0)
            token = tl.load(tokens_ptr + base + c)
            sampled = child & (greedy == 0)
            p = _scalar(
                tl.load(probs_ptr + row * p_stride + tl.maximum(token, 0), mask=sampled, other=0.0), F64
            )
            u = _scalar(tl.load(u_ptr + b * (M + 1) + c, mask=child, other=1.0), F64)
            fresh = child & (tl.load(dup_ptr + base + c) == 0)
            take = tl.where(greedy, child & (token == best), fresh & (u * (1.0 - mass) < p))
            mass += tl.where(fresh & (take == 0) & (greedy == 0), p, zero)
            accepted = tl.where(take, c, accepted)
        descend = accepted >= 0
        tl.store(path_ptr + base + depth, accepted, mask=descend)
        depth += descend.to(tl.int64)
        node = tl.where(descend, accepted, node)
        stopped = stopped | (descend == 0)
    row = start + 1 + node
    final = _target_argmax(argmax_ptr, row, greedy, HAS_ARGMAX)
    if greedy == 0:
        u = _scalar(tl.load(u_ptr + b * (M + 1) + M), F64)
        final = _residual_sample(
            probs_ptr, row, p_stride, V, parents_ptr, tokens_ptr, base, node, M, u, zero, F64, BLOCK_V
        )
    tl.store(final_ptr + b, final)


class TritonTreeOps:
    """``SamplerOps.tree_verify`` for ``TritonSamplerOps`` (it supplies ``tuning``)."""

    tuning: SamplerTuning

    def tree_verify(
        self,
        parents: torch.Tensor,  # [B, M] int64
        tokens: torch.Tensor,  # [B, M] int64
        target_probs: torch.Tensor,  # [N, V] float32
        target_argmax: torch.Tensor | None,  # [N] int64
        row_start: torch.Tensor,  # [B] int64
        greedy: torch.Tensor,  # [B] bool
        uniforms: torch.Tensor,  # [B, M + 1] float64
        draft_probs: torch.Tensor | None = None,  # [B, M, V] float32: sampled siblings (``tree_sampled``)
    ) -> tuple[torch.Tensor, torch.Tensor]:  # path [B, M] int64 (-1 past), final [B] int64
        """See the module docstring; with ``draft_probs``, ``triton.tree_sampled``'s kernel."""
        if draft_probs is not None:
            return tree_verify_sampled(
                self.tuning, parents, tokens, draft_probs, target_probs, target_argmax, row_start, greedy,
                uniforms,
            )  # fmt: skip
        batch, m = parents.shape
        f64 = self.tuning.device_uniforms
        path = torch.full((batch, m), -1, dtype=torch.int64, device=parents.device)
        final = torch.empty(batch, dtype=torch.int64, device=parents.device)
        if batch == 0:
            return path, final
        probs = target_probs.contiguous()
        argmax = target_argmax if target_argmax is not None else row_start  # never read without HAS_ARGMAX
        tree_verify_kernel[(batch,)](
            parents.contiguous(), tokens.contiguous(), repeated_siblings(parents, tokens).to(torch.int8),
            probs, probs.stride(0), argmax, row_start, greedy.to(torch.int8),
            uniforms.to(torch.float64 if f64 else torch.float32).contiguous(), path, final, m, probs.shape[1],
            HAS_ARGMAX=target_argmax is not None, F64=f64, BLOCK_V=self.tuning.vocab_block,
        )  # fmt: skip
        return path, final


__all__ = ["TritonTreeOps", "tree_verify_kernel"]
