"""``TritonSamplerOps``' row-wide ops: the temperature softmax and the residual sampling, each over whole
vocabulary rows, with one program per row (``triton_kernels`` / ``triton_kernels_verify``) or, when
``SamplerTuning.vocab_splits`` > 1, each row shared by up to that many programs and their partial results
combined by a second launch (``triton_kernels_split``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from spec_backend.sampling import rng
from spec_backend.sampling import triton_kernels as _k
from spec_backend.sampling import triton_kernels_split as _ks
from spec_backend.sampling import triton_kernels_verify as _kv
from spec_backend.sampling.tuning import SamplerTuning

#: ``launch(kernel, work items, *args, **constexprs)``: ``TritonSamplerOps._launch``
Launch = Callable[..., None]


def rows(t: torch.Tensor) -> torch.Tensor:
    """Row-major with unit inner stride (a no-op for the usual contiguous inputs)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def softmax(
    launch: Launch, tuning: SamplerTuning, logits: torch.Tensor, temperature: torch.Tensor
) -> torch.Tensor:  # logits [N, V], temperature [N] -> [N, V] float32 softmax(logits / T)
    logits, temperature = rows(logits), temperature.contiguous()
    n, vocab = logits.shape
    block = tuning.vocab_block
    out = torch.empty(n, vocab, dtype=torch.float32, device=logits.device)  # [N, V]
    splits, chunk, block_s = _ks.split_plan(vocab, tuning.vocab_splits, block)
    if n == 0:
        return out
    if splits == 1:
        launch(
            _k.temperature_softmax_kernel, n, logits, logits.stride(0), temperature, out, out.stride(0),
            n, vocab, BLOCK_V=block,
        )  # fmt: skip
        return out
    stats = torch.empty(2, n * splits, dtype=torch.float32, device=logits.device)  # [2, N * splits]
    common = (logits, logits.stride(0), temperature, stats[0], stats[1])
    launch(_ks.softmax_partials_kernel, n * splits, *common, n, vocab, splits, chunk, BLOCK_V=block)
    launch(
        _ks.softmax_normalise_kernel, n * splits, *common, out, out.stride(0), n, vocab, splits, chunk,
        BLOCK_V=block, BLOCK_S=block_s,
    )  # fmt: skip
    return out


def residual(
    launch: Launch,
    tuning: SamplerTuning,
    target_probs: torch.Tensor,  # [N, V]
    target_rows: torch.Tensor,  # [R]
    draft_probs: torch.Tensor | None,  # [T, V]
    draft_ids: torch.Tensor,  # [T]
    draft_rows: torch.Tensor,  # [R]
    scale: torch.Tensor,  # [R] float64
    seeds: torch.Tensor,  # [R]
    positions: torch.Tensor,  # [R]
) -> torch.Tensor:  # [R] int64 tokens
    """``SamplerOps.sample_residual`` (see ``sample_residual_kernel``)."""
    count, device = target_rows.shape[0], target_probs.device
    out = torch.zeros(count, dtype=torch.int64, device=device)
    if count == 0:
        return out
    target_probs = rows(target_probs)
    has_drafts = draft_ids.numel() > 0
    has_q = has_drafts and draft_probs is not None
    q = rows(draft_probs) if has_q and draft_probs is not None else target_probs
    ids = draft_ids if has_drafts else target_rows  # dummy pointer, never read without drafts
    args = (
        *(target_probs, target_probs.stride(0), target_rows.contiguous(), q, q.stride(0) if has_q else 0),
        *(ids.contiguous(), draft_rows.contiguous()),
        scale.to(torch.float32).contiguous(),  # the reference applies b in float32
        *(seeds.contiguous(), positions.contiguous()),
    )
    block, vocab = tuning.vocab_block, target_probs.shape[1]
    flags = {"HAS_DRAFTS": has_drafts, "HAS_Q": has_q, "STREAM": rng.STREAM_SAMPLE, "BLOCK_V": block}
    splits, chunk, block_s = _ks.split_plan(vocab, tuning.vocab_splits, block)
    if splits == 1:
        launch(_kv.sample_residual_kernel, count, *args, out, count, vocab, **flags)
        return out
    keys = torch.empty(count * splits, 2, dtype=torch.float32, device=device)  # [R * splits, 2]
    idx = torch.empty(count * splits, 2, dtype=torch.int32, device=device)  # [R * splits, 2]
    any_w = torch.empty(count * splits, dtype=torch.int32, device=device)  # [R * splits]
    launch(
        _ks.residual_partials_kernel, count * splits, *args, keys, idx, any_w, count, vocab, splits, chunk,
        **flags,
    )  # fmt: skip
    launch(_ks.residual_combine_kernel, count, keys, idx, any_w, out, count, splits, BLOCK_S=block_s)
    return out


__all__ = ["Launch", "residual", "rows", "softmax"]
