"""``TritonSamplerOps``' row-wide ops: the temperature softmax and the residual sampling, each over whole
vocabulary rows, with one program per row (``triton.softmax`` / ``triton.verify``) or, when
``SamplerTuning.vocab_splits`` > 1, each row shared by up to that many programs and their partial results
combined by a second launch (``triton.split``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from spec_backend.sampling import rng
from spec_backend.sampling.triton import fused as _kf
from spec_backend.sampling.triton import softmax as _ksm
from spec_backend.sampling.triton import split as _ks
from spec_backend.sampling.triton import verify as _kv
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
            _ksm.temperature_softmax_kernel, n, logits, logits.stride(0), temperature, out, out.stride(0),
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
    keys, idx, any_w = _race_buffers(count * splits, device)  # [R * splits, 2], [R * splits, 2], [R * splits]
    launch(
        _ks.residual_partials_kernel, count * splits, *args, keys, idx, any_w, keys, count, vocab, splits,
        chunk, **flags, FROM_LOGITS=False,
    )  # fmt: skip
    launch(_ks.residual_combine_kernel, count, keys, idx, any_w, out, count, splits, BLOCK_S=block_s)
    return out


def _draft_rows(draft_probs: torch.Tensor | None, logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The draft probabilities [T, V] for the kernels and their row stride; without them the logits as a
    stand-in that is never read, stride 0."""
    if draft_probs is None:
        return logits, 0
    q = rows(draft_probs)
    return q, q.stride(0)


def _race_buffers(items: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``residual_partials_kernel``'s outputs, keys [items, 2] float32, indices [items, 2] int32, any w > 0
    [items] int32: uninitialised, since the kernel writes every item (and none is read when no request
    samples)."""
    keys = torch.empty(items, 2, dtype=torch.float32, device=device)
    return (
        keys,
        torch.empty(items, 2, dtype=torch.int32, device=device),
        torch.empty_like(keys[:, 0], dtype=torch.int32),
    )


def _is_block_rule(rule: str, with_q: bool) -> bool:
    """``fused_verify``'s rule: True for "block", False for "token"; ValueError for anything else."""
    if rule not in ("token", "block") or (rule == "block" and with_q):
        raise ValueError(
            "fused_verify: rule must be 'token' (with or without draft_probs) or 'block' (point-mass "
            f"drafts only), got rule={rule!r} with draft_probs {'given' if with_q else 'None'}"
        )
    return rule == "block"


def fused_verify(
    launch: Launch,
    tuning: SamplerTuning,
    logits: torch.Tensor,  # [N, V]
    draft_probs: torch.Tensor | None,  # [T, V] (the token-level rule only)
    layout: tuple[torch.Tensor, ...],  # draft_ids [T], target_rows [T], bonus_rows [B], request [T], ...
    temperature: torch.Tensor,  # [B]
    seeds: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64
    max_spec_len: int,
    rule: str,  # "token" or "block" (point-mass drafts only)
    sampled: bool,
) -> torch.Tensor:  # [B, max_spec_len + 1] int32
    """The verification without materialised probabilities (``triton.fused``): four launches;
    ``layout`` is (draft_ids [T], target_rows [T], bonus_rows [B], request [T], slot [T], cu [B])."""
    block = _is_block_rule(rule, draft_probs is not None)
    logits, temperature = rows(logits), temperature.contiguous()
    q, q_stride = _draft_rows(draft_probs, logits)
    draft_ids, target_rows, bonus_rows, request, slot, cu = (t.contiguous() for t in layout)
    batch, total, vocab, device = cu.shape[0], draft_ids.shape[0], logits.shape[1], logits.device
    out = torch.empty(batch, max_spec_len + 1, dtype=torch.int32, device=device)  # [B, S + 1]
    if batch == 0:
        return out
    if total == 0:  # stand-ins, never read
        draft_ids, target_rows, request, slot = bonus_rows, bonus_rows, bonus_rows, bonus_rows
    tile = tuning.fused_block or tuning.vocab_block
    splits, chunk, block_s = _ks.split_plan(vocab, tuning.vocab_splits, tile)
    items = (total + batch) * splits
    stats = torch.empty(2, items, dtype=torch.float32, device=device)  # [2, E * splits] max, sum
    amax = torch.empty(items, dtype=torch.int32, device=device)  # [E * splits]
    entries = (logits, logits.stride(0), draft_ids, target_rows, bonus_rows, request, slot, cu, temperature)
    launch(
        _kf.fused_stats_kernel, items, *entries, stats[0], stats[1], amax, total, total + batch, vocab,
        splits, chunk, SAMPLED=sampled, BLOCK_V=tile,
    )  # fmt: skip
    counts, final_rows, final_drafts, final_pos, tokens = torch.empty(
        5, batch, dtype=torch.int64, device=device
    )
    final = torch.empty(4, batch, dtype=torch.float32, device=device)  # [4, B] scale, then [3, B] stats
    launch(
        _kf.fused_decide_kernel, batch, *entries, seeds.contiguous(), positions.contiguous(), stats[0],
        stats[1], amax, q, q_stride, counts, final_rows, final_drafts, final[0], final_pos, final[1:], tokens,
        total, batch, vocab, splits, SAMPLED=sampled, BLOCK=block, ACCEPT=rng.STREAM_ACCEPT, BLOCK_S=block_s,
        HAS_Q=draft_probs is not None,
    )  # fmt: skip
    race = splits if sampled else 1  # all greedy: no race, one (empty) chunk per request
    keys, idx, any_w = _race_buffers(batch * race, device)
    if sampled:
        launch(
            _ks.residual_partials_kernel, batch * splits, logits, logits.stride(0), final_rows, q, q_stride,
            draft_ids, final_drafts, final[0], seeds.contiguous(), final_pos, keys, idx, any_w, final[1:],
            batch, vocab, splits, chunk, HAS_DRAFTS=total > 0, HAS_Q=total > 0 and draft_probs is not None,
            STREAM=rng.STREAM_SAMPLE, BLOCK_V=tile, FROM_LOGITS=True,
        )  # fmt: skip
    launch(
        _kf.fused_output_kernel, batch, keys, idx, any_w, counts, tokens, temperature, draft_ids, cu,
        out, batch, max_spec_len, race, BLOCK_S=block_s if sampled else 1,
    )  # fmt: skip
    return out


__all__ = ["Launch", "fused_verify", "residual", "rows", "softmax"]
