"""``TritonSamplerOps``' row-wide ops: the temperature softmax and the residual sampling, each over whole
vocabulary rows, with one program per row (``triton_kernels`` / ``triton_kernels_verify``) or, when
``SamplerTuning.vocab_splits`` > 1, each row shared by up to that many programs and their partial results
combined by a second launch (``triton_kernels_split``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from spec_backend.sampling import rng
from spec_backend.sampling import triton_kernels as _k
from spec_backend.sampling import triton_kernels_fused as _kf
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


def point_mass(
    launch: Launch,
    tuning: SamplerTuning,
    logits: torch.Tensor,  # [N, V]
    layout: tuple[
        torch.Tensor, ...
    ],  # draft_ids [T], target_rows [T], bonus_rows [B], request [T], slot [T], cu [B]
    temperature: torch.Tensor,  # [B]
    seeds: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64
    max_spec_len: int,
    block: bool,
    sampled: bool,
) -> torch.Tensor:  # [B, max_spec_len + 1] int32
    """The whole verification of point-mass drafts (``triton_kernels_fused``): two launches."""
    logits = rows(logits)
    draft_ids, target_rows, bonus_rows, request, slot, cu = (t.contiguous() for t in layout)
    batch, total, vocab, device = cu.shape[0], draft_ids.shape[0], logits.shape[1], logits.device
    out = torch.empty(batch, max_spec_len + 1, dtype=torch.int32, device=device)  # [B, S + 1]
    if batch == 0:
        return out
    if total == 0:  # stand-ins, never read
        draft_ids, target_rows, request, slot = bonus_rows, bonus_rows, bonus_rows, bonus_rows
    splits, chunk, block_s = _ks.split_plan(vocab, tuning.vocab_splits, tuning.vocab_block)
    items = (total + batch) * splits
    stats = torch.empty(3, items, dtype=torch.float32, device=device)  # [3, E * splits] max, sum, key
    index = torch.empty(2, items, dtype=torch.int32, device=device)  # [2, E * splits] argmax, race
    common = (
        *(logits, logits.stride(0), draft_ids, target_rows, bonus_rows, request, slot, cu),
        *(temperature.contiguous(), seeds.contiguous(), positions.contiguous()),
        *(stats[0], stats[1], stats[2], index[0], index[1]),
    )
    launch(
        _kf.point_mass_rows_kernel, items, *common, total, total + batch, vocab, splits, chunk,
        SAMPLED=sampled, STREAM=rng.STREAM_SAMPLE, BLOCK_V=tuning.vocab_block,
    )  # fmt: skip
    launch(
        _kf.point_mass_finish_kernel, batch, *common, out, total, batch, vocab, max_spec_len, splits,
        SAMPLED=sampled, BLOCK=block, ACCEPT=rng.STREAM_ACCEPT, BLOCK_S=block_s,
    )  # fmt: skip
    return out


__all__ = ["Launch", "point_mass", "residual", "rows", "softmax"]
