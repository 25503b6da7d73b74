# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""``SamplerOps.tree_verify`` with ``draft_probs`` in triton: recursive rejection sampling over sampled
siblings (``verify_rules.TREE_REGISTRY``'s ``rrs``; the rule and the layout are ``sampling.tree_ops``'s,
this kernel follows ``sampling.tree_verify.verify_tree`` step for step).

One program per request holds the residual ``r`` of the node it stands on in a scratch row ``[V]``: the
target's row when it arrives at a node, then, for each rejected child ``i``, ``norm(max(r - q_i, 0))``
(two vocabulary passes: the total, then the new row; a total of 0 leaves ``r`` as it was). Child ``x`` is
accepted when ``q_i(x) > 0`` and ``u · q_i(x) < r(x)``. The final token is drawn from the scratch row by
inverse CDF (two passes). Greedy requests follow ``target_argmax``. Scalars and the scratch row are
float64 with ``F64`` (CUDA), float32 otherwise; decisions match the torch op except within rounding of a
tie (blocked sums differ from torch's in the last bits).

Glossary: *residual* — the distribution still to be matched at a node after its rejected children.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from spec_backend.sampling.triton.tree_common import _crossing, _target_argmax
from spec_backend.sampling.triton.verify import _scalar
from spec_backend.sampling.tuning import SamplerTuning


@triton.jit
def _arrive(probs_ptr, row, p_stride, scratch_ptr, V, F64: tl.constexpr, BLOCK_V: tl.constexpr):
    """The scratch row becomes the target's row ``row``."""
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + tl.arange(0, BLOCK_V)
        live = idx < V
        mass = _scalar(tl.load(probs_ptr + row * p_stride + idx, mask=live, other=0.0), F64)
        tl.store(scratch_ptr + idx, mass, mask=live)
    tl.debug_barrier()


@triton.jit
def _reject(scratch_ptr, q_ptr, V, zero, F64: tl.constexpr, BLOCK_V: tl.constexpr):
    """``r <- norm(max(r - q, 0))``, ``r`` as it was where that mass is 0."""
    total = zero
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + tl.arange(0, BLOCK_V)
        live = idx < V
        r = tl.load(scratch_ptr + idx, mask=live, other=0.0)
        q = _scalar(tl.load(q_ptr + idx, mask=live, other=0.0), F64)
        total += tl.sum(tl.maximum(r - q, 0.0), axis=0)
    if total > 0:
        for v0 in range(0, V, BLOCK_V):
            idx = v0 + tl.arange(0, BLOCK_V)
            live = idx < V
            r = tl.load(scratch_ptr + idx, mask=live, other=0.0)
            q = _scalar(tl.load(q_ptr + idx, mask=live, other=0.0), F64)
            tl.store(scratch_ptr + idx, tl.maximum(r - q, 0.0) / total, mask=live)
    tl.debug_barrier()


@triton.jit
def _draw(scratch_ptr, V, u, zero, BLOCK_V: tl.constexpr):
    """The first token whose running mass exceeds ``u`` of the total (the last of positive mass where
    rounding leaves none)."""
    total = zero
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + tl.arange(0, BLOCK_V)
        total += tl.sum(tl.load(scratch_ptr + idx, mask=idx < V, other=0.0), axis=0)
    threshold = u * total
    running = zero
    chosen = tl.zeros((), tl.int64) - 1
    last = tl.zeros((), tl.int64) - 1
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + tl.arange(0, BLOCK_V)
        live = idx < V
        mass = tl.load(scratch_ptr + idx, mask=live, other=0.0)
        chosen, last, running = _crossing(idx, live, mass, running, threshold, chosen, last, V)
    return tl.where(chosen >= 0, chosen, last)


@triton.jit
def tree_verify_sampled_kernel(
    parents_ptr,  # [B, M] int64 (-1 root, -2 padding)
    tokens_ptr,  # [B, M] int64
    q_ptr,  # [B, M, V] float32: node i's q given its earlier siblings
    probs_ptr,  # [N, V] float32
    p_stride,
    argmax_ptr,  # [N] int64 (unused without HAS_ARGMAX)
    start_ptr,  # [B] int64
    greedy_ptr,  # [B] int8
    u_ptr,  # [B, M + 1] float64 / float32
    scratch_ptr,  # [B, V] float64 / float32: each request's residual
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
    scratch = scratch_ptr + b * V
    start = tl.load(start_ptr + b).to(tl.int64)
    greedy = tl.load(greedy_ptr + b) != 0
    zero = _scalar(tl.zeros((), tl.float32), F64)
    node = tl.zeros((), tl.int64) - 1
    depth = tl.zeros((), tl.int64)
    stopped = node > 0
    for _level in range(0, M):
        row = start + 1 + node
        if (stopped == 0) & (greedy == 0):
            _arrive(probs_ptr, row, p_stride, scratch, V, F64, BLOCK_V)
        best = _target_argmax(argmax_ptr, row, greedy, HAS_ARGMAX)
        accepted = tl.zeros((), tl.int64) - 1
        for c in range(0, M):
            child = (tl.load(parents_ptr + base + c) == node) & (accepted < 0) & (stopped == 0)
            token = tl.maximum(tl.load(tokens_ptr + base + c), 0)
            sampled = child & (greedy == 0)
            q_row = q_ptr + (base + c) * V
            q = _scalar(tl.load(q_row + token, mask=sampled, other=0.0), F64)
            r = tl.load(scratch + token, mask=sampled, other=0.0)
            u = _scalar(tl.load(u_ptr + b * (M + 1) + c, mask=sampled, other=1.0), F64)
            take = tl.where(greedy, child & (token == best), sampled & (q > 0) & (u * q < r))
            if sampled & (take == 0):
                _reject(scratch, q_row, V, zero, F64, BLOCK_V)
            accepted = tl.where(take, c, accepted)
        descend = accepted >= 0
        tl.store(path_ptr + base + depth, accepted, mask=descend)
        depth += descend.to(tl.int64)
        node = tl.where(descend, accepted, node)
        stopped = stopped | (descend == 0)
    row = start + 1 + node
    final = _target_argmax(argmax_ptr, row, greedy, HAS_ARGMAX)
    if greedy == 0:
        if stopped == 0:  # every level descended: the scratch row is still the last node's parent's
            _arrive(probs_ptr, row, p_stride, scratch, V, F64, BLOCK_V)
        u = _scalar(tl.load(u_ptr + b * (M + 1) + M), F64)
        final = _draw(scratch, V, u, zero, BLOCK_V)
    tl.store(final_ptr + b, final)


def tree_verify_sampled(
    tuning: SamplerTuning,
    parents: torch.Tensor,  # [B, M] int64
    tokens: torch.Tensor,  # [B, M] int64
    draft_probs: torch.Tensor,  # [B, M, V] float32
    target_probs: torch.Tensor,  # [N, V] float32
    target_argmax: torch.Tensor | None,  # [N] int64
    row_start: torch.Tensor,  # [B] int64
    greedy: torch.Tensor,  # [B] bool
    uniforms: torch.Tensor,  # [B, M + 1] float64
) -> tuple[torch.Tensor, torch.Tensor]:  # path [B, M] int64 (-1 past), final [B] int64
    """Launch ``tree_verify_sampled_kernel`` (module docstring)."""
    batch, m = parents.shape
    f64 = tuning.device_uniforms
    dtype = torch.float64 if f64 else torch.float32
    path = torch.full((batch, m), -1, dtype=torch.int64, device=parents.device)
    final = torch.empty(batch, dtype=torch.int64, device=parents.device)
    if batch == 0:
        return path, final
    probs, vocab = target_probs.contiguous(), target_probs.shape[1]
    scratch = torch.empty((batch, vocab), dtype=dtype, device=parents.device)  # [B, V]
    argmax = target_argmax if target_argmax is not None else row_start  # never read without HAS_ARGMAX
    tree_verify_sampled_kernel[(batch,)](
        parents.contiguous(), tokens.contiguous(), draft_probs.float().contiguous(), probs, probs.stride(0),
        argmax, row_start, greedy.to(torch.int8), uniforms.to(dtype).contiguous(), scratch, path, final, m,
        vocab, HAS_ARGMAX=target_argmax is not None, F64=f64, BLOCK_V=tuning.vocab_block,
    )  # fmt: skip
    return path, final


__all__ = ["tree_verify_sampled", "tree_verify_sampled_kernel"]
