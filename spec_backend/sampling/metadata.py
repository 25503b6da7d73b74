"""Batch metadata of one verification step: where the drafts are (``SpecDecodeMetadata``; how each
request samples is ``sampling_metadata.SamplingMetadata``).

``SpecDecodeMetadata`` follows vLLM's layout. Request ``b`` has ``K_b = num_draft_tokens[b]`` draft
tokens (0..128); the logits handed to the sampler hold, per request, its ``K_b`` target rows (the target
distribution at each draft position) followed by its bonus row (the position after the last draft)::

    logits rows:  [r0 t0, r0 t1, .., r0 bonus, r1 t0, .., r1 bonus, ...]      # [T + B, V]

Placeholder drafts: a draft id equal to ``PLACEHOLDER_TOKEN_ID`` (-1), as vLLM and vllm-ascend pass for
draft positions that must not be verified, ends that request's drafts at its position. The drafts before
it verify as usual; if they are all accepted, the placeholder's position emits a token sampled from the
target distribution there (a *null draft*: q = 0, never accepted), so the output stays lossless; a
placeholder is never emitted and never used as an index.

Host-side work (building these objects) may synchronise; the sampler's hot path never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spec_backend.sampling.errors import SamplerInputError

#: Output padding after a request's last emitted token, and the draft id of a placeholder draft.
PLACEHOLDER_TOKEN_ID = -1
#: Largest token id the sampler accepts (draft ids are int32).
MAX_TOKEN_ID = 2**31 - 1

DeviceLike = torch.device | str | None


@dataclass
class SpecDecodeMetadata:
    """Draft tokens of a batch and the logits rows that verify them (vLLM's layout).

    ``draft_token_ids`` [T] int32, ``num_draft_tokens`` list[B], ``cu_num_draft_tokens`` [B] int32
    (inclusive cumulative sum), ``target_logits_indices`` [T] int32 and ``bonus_logits_indices`` [B] int32
    (rows of the sampler's ``logits``), ``logits_indices`` [T+B] int32 (rows of the model output the
    engine selected; ``arange(T+B)`` when the logits are already selected), ``max_spec_len`` = max K.

    Derived (filled in when omitted, from the host-side ``num_draft_tokens``, no device sync):
    ``request_index`` [T] int64 (request of each draft) and ``slot_index`` [T] int64 (its 0-based slot).
    ``max_draft_token_id`` is the largest draft id when known on the host (``from_draft_tokens``); the
    sampler compares it with the vocabulary size for free, otherwise ids are range-checked only in debug.
    ``standard_layout``: True when the constructor built the indices itself (``from_draft_tokens``,
    ``from_layout``), so the logits rows are known on the host to be in the layout above.
    """

    draft_token_ids: torch.Tensor  # [T] int32
    num_draft_tokens: list[int]  # [B]
    cu_num_draft_tokens: torch.Tensor  # [B] int32
    target_logits_indices: torch.Tensor  # [T] int32
    bonus_logits_indices: torch.Tensor  # [B] int32
    logits_indices: torch.Tensor  # [T + B] int32
    max_spec_len: int = -1
    request_index: torch.Tensor | None = None  # [T] int64
    slot_index: torch.Tensor | None = None  # [T] int64
    max_draft_token_id: int | None = field(default=None)
    standard_layout: bool = False

    def __post_init__(self) -> None:
        nums = list(self.num_draft_tokens)
        if any((not isinstance(k, int)) or k < 0 for k in nums):
            raise SamplerInputError(f"num_draft_tokens must be non-negative ints, got {nums}")
        self.num_draft_tokens = nums
        self.draft_token_ids = _as_int32_ids(self.draft_token_ids)
        total, batch = sum(nums), len(nums)
        if self.max_spec_len < 0:
            self.max_spec_len = max(nums, default=0)
        elif self.max_spec_len != max(nums, default=0):
            raise SamplerInputError(
                f"max_spec_len={self.max_spec_len} but max(num_draft_tokens)={max(nums, default=0)}"
            )
        expected = {
            "draft_token_ids": (total,),
            "cu_num_draft_tokens": (batch,),
            "target_logits_indices": (total,),
            "bonus_logits_indices": (batch,),
            "logits_indices": (total + batch,),
        }
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise SamplerInputError(
                    f"SpecDecodeMetadata.{name} has shape {list(got)}, expected {list(shape)} "
                    f"for num_draft_tokens={nums}"
                )
        device = self.draft_token_ids.device
        if self.request_index is None or self.slot_index is None:  # from the host counts: one copy
            request = [b for b, k in enumerate(nums) for _ in range(k)]  # [T]
            slot = [t for k in nums for t in range(k)]  # [T]
            wide = torch.tensor(request + slot, dtype=torch.int64).to(device)
            self.request_index, self.slot_index = torch.split(wide, [total, total])

    @property
    def batch_size(self) -> int:
        return len(self.num_draft_tokens)

    @property
    def num_tokens(self) -> int:
        """T: draft tokens in the batch."""
        return sum(self.num_draft_tokens)

    @classmethod
    def from_draft_tokens(
        cls, draft_token_ids: Sequence[Sequence[int]], device: DeviceLike = None
    ) -> SpecDecodeMetadata:
        """Build the metadata for per-request draft lists, logits laid out as K target rows + bonus row."""
        drafts = [list(d) for d in draft_token_ids]
        nums = [len(d) for d in drafts]
        flat = [t for d in drafts for t in d]
        for t in flat:
            if isinstance(t, bool) or not isinstance(t, int) or not PLACEHOLDER_TOKEN_ID <= t <= MAX_TOKEN_ID:
                raise SamplerInputError(
                    f"draft token ids must be ints in [0, 2**31 - 1] or PLACEHOLDER_TOKEN_ID (-1), "
                    f"got {t!r} in {drafts}"
                )
        dev = torch.device(device) if device is not None else torch.device("cpu")
        ids = torch.tensor(flat, dtype=torch.int32).to(dev)
        return cls.from_layout(ids, nums, max(flat, default=-1))

    @classmethod
    def from_layout(
        cls, draft_token_ids: torch.Tensor, num_draft_tokens: Sequence[int], max_draft_token_id: int | None
    ) -> SpecDecodeMetadata:
        """Metadata for ``draft_token_ids`` [T] (on any device), logits laid out as K target rows + bonus.

        ``max_draft_token_id``: the largest id when known on the host (else None: checked in debug mode).
        """
        nums = list(num_draft_tokens)
        target: list[int] = []
        bonus: list[int] = []
        row = 0
        for k in nums:
            target.extend(range(row, row + k))
            bonus.append(row + k)
            row += k + 1
        dev = draft_token_ids.device
        cu = torch.cumsum(torch.tensor(nums, dtype=torch.int64), 0) if nums else torch.zeros(0)

        def as_i32(values: Sequence[int] | torch.Tensor) -> torch.Tensor:
            return torch.as_tensor(values, dtype=torch.int32).reshape(-1).to(dev)

        return cls(
            draft_token_ids=draft_token_ids,
            num_draft_tokens=nums,
            cu_num_draft_tokens=as_i32(cu),
            target_logits_indices=as_i32(target),
            bonus_logits_indices=as_i32(bonus),
            logits_indices=as_i32(torch.arange(row)),
            max_spec_len=max(nums, default=0),
            max_draft_token_id=max_draft_token_id,
            standard_layout=True,
        )


def _as_int32_ids(ids: object) -> torch.Tensor:
    """Draft ids as int32, refusing what int32 cannot hold before the cast (no silent wrap-around).

    Integer tensors wider than int32 are range-checked (one small device read: metadata is built on the
    host side); int32 and narrower need no check.
    """
    if not isinstance(ids, torch.Tensor):
        raise SamplerInputError(f"draft_token_ids must be a tensor, got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise SamplerInputError(f"draft_token_ids must have an integer dtype, got {ids.dtype}")
    if ids.dtype == torch.int32:
        return ids
    if ids.numel() and torch.iinfo(ids.dtype).bits > 32:
        lo, hi = torch.aminmax(ids)
        if int(lo) < PLACEHOLDER_TOKEN_ID or int(hi) > MAX_TOKEN_ID:
            bad = int(lo) if int(lo) < PLACEHOLDER_TOKEN_ID else int(hi)
            raise SamplerInputError(
                f"draft_token_ids contains {bad}, outside [0, 2**31 - 1] (or PLACEHOLDER_TOKEN_ID = -1)"
            )
    return ids.to(torch.int32)


__all__ = ["MAX_TOKEN_ID", "PLACEHOLDER_TOKEN_ID", "SpecDecodeMetadata"]
