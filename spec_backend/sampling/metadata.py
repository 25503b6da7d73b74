"""Batch metadata of one verification step: where the drafts are, and how each request samples.

``SpecDecodeMetadata`` follows vLLM's layout. Request ``b`` has ``K_b = num_draft_tokens[b]`` draft
tokens (0..128); the logits handed to the sampler hold, per request, its ``K_b`` target rows (the target
distribution at each draft position) followed by its bonus row (the position after the last draft)::

    logits rows:  [r0 t0, r0 t1, .., r0 bonus, r1 t0, .., r1 bonus, ...]      # [T + B, V]

Host-side work (building these objects) may synchronise; the sampler's hot path never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spec_backend.sampling.validation import SamplerInputError

#: Output padding after a request's last emitted token.
PLACEHOLDER_TOKEN_ID = -1

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
        if self.request_index is None or self.slot_index is None:
            counts = torch.tensor(nums, dtype=torch.int64)
            req = torch.repeat_interleave(torch.arange(batch, dtype=torch.int64), counts)  # [T]
            starts = torch.cumsum(counts, 0) - counts  # [B]
            slot = torch.arange(total, dtype=torch.int64) - starts[req]  # [T]
            self.request_index = req.to(device)
            self.slot_index = slot.to(device)

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
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise SamplerInputError(f"draft token ids must be non-negative ints, got {t!r} in {drafts}")
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
            draft_token_ids=draft_token_ids.to(torch.int32),
            num_draft_tokens=nums,
            cu_num_draft_tokens=as_i32(cu),
            target_logits_indices=as_i32(target),
            bonus_logits_indices=as_i32(bonus),
            logits_indices=as_i32(torch.arange(row)),
            max_spec_len=max(nums, default=0),
            max_draft_token_id=max_draft_token_id,
            standard_layout=True,
        )


@dataclass
class SamplingMetadata:
    """Per-request sampling parameters, all [B] tensors on the logits' device.

    * ``temperature`` [B] float32: 0 means greedy (argmax of the raw logits); must be >= 0 and finite.
    * ``top_k`` [B] int64: keep the k largest logits (ties at the k-th value kept); 0 or >= V means off.
    * ``top_p`` [B] float32 in (0, 1]: keep the smallest descending-probability prefix with mass >= top_p.
    * ``seeds`` [B] int64 or None: a seed >= 0 makes the request reproducible; a negative entry (or
      ``seeds=None``) means unseeded, and a fresh 63-bit seed is drawn per call on the device.
    * ``positions`` [B] int64 or None: absolute sequence position of each request's first draft token.
      It is the counter of the random numbers: **engines must pass it** for seeded requests, otherwise
      every step of a seeded request reuses the same random numbers (a warning is logged once). None
      means all zeros.

    ``__post_init__`` validates the values and records host-side flags (``all_greedy``, ``all_random``,
    ``apply_top_k``, ``apply_top_p``) with one small device-to-host copy at construction time, so the
    sampler's hot path can branch on them without synchronising.
    """

    temperature: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64
    top_p: torch.Tensor  # [B] float32
    seeds: torch.Tensor | None = None  # [B] int64
    positions: torch.Tensor | None = None  # [B] int64
    all_greedy: bool = field(init=False, default=False)
    all_random: bool = field(init=False, default=False)
    apply_top_k: bool = field(init=False, default=False)
    apply_top_p: bool = field(init=False, default=False)
    has_seeds: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        batch = self.temperature.shape[0] if self.temperature.dim() == 1 else -1
        tensors = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        if self.seeds is not None:
            tensors["seeds"] = self.seeds
        if self.positions is not None:
            tensors["positions"] = self.positions
        for name, t in tensors.items():
            if t.dim() != 1 or t.shape[0] != batch:
                raise SamplerInputError(
                    f"SamplingMetadata.{name} has shape {list(t.shape)}, expected [B] with "
                    f"B={batch} (temperature's length)"
                )
        temp = self.temperature.to(torch.float32)
        stats = torch.stack(
            [
                (temp < 0).any() | ~torch.isfinite(temp).all(),
                ((self.top_p <= 0) | (self.top_p > 1) | torch.isnan(self.top_p)).any(),
                (self.top_k < 0).any(),
                (temp == 0).all(),
                (temp > 0).all(),
                ((self.top_k > 0) & (temp > 0)).any(),
                ((self.top_p < 1) & (temp > 0)).any(),
                (self.seeds >= 0).any()
                if self.seeds is not None
                else torch.tensor(False, device=temp.device),
            ]
        ).tolist()
        bad_temp, bad_top_p, bad_top_k = stats[0], stats[1], stats[2]
        if bad_temp:
            raise SamplerInputError(f"temperature must be finite and >= 0, got {self.temperature.tolist()}")
        if bad_top_p:
            raise SamplerInputError(f"top_p must be in (0, 1], got {self.top_p.tolist()}")
        if bad_top_k:
            raise SamplerInputError(f"top_k must be >= 0 (0 = off), got {self.top_k.tolist()}")
        self.all_greedy, self.all_random = bool(stats[3]), bool(stats[4])
        self.apply_top_k, self.apply_top_p, self.has_seeds = bool(stats[5]), bool(stats[6]), bool(stats[7])

    @property
    def batch_size(self) -> int:
        return int(self.temperature.shape[0])

    @classmethod
    def from_lists(
        cls,
        temperature: Sequence[float],
        top_k: Sequence[int] | None = None,
        top_p: Sequence[float] | None = None,
        seeds: Sequence[int | None] | None = None,
        positions: Sequence[int] | None = None,
        device: DeviceLike = None,
    ) -> SamplingMetadata:
        """Build from per-request Python values; ``None`` seeds mean unseeded."""
        batch = len(temperature)
        dev = torch.device(device) if device is not None else torch.device("cpu")
        for name, values in (("top_k", top_k), ("top_p", top_p), ("seeds", seeds), ("positions", positions)):
            if values is not None and len(values) != batch:
                raise SamplerInputError(f"{name} has {len(values)} entries, expected B={batch}")
        return cls(
            temperature=torch.tensor(list(temperature), dtype=torch.float32, device=dev),
            top_k=torch.tensor(
                list(top_k) if top_k is not None else [0] * batch, dtype=torch.int64, device=dev
            ),
            top_p=torch.tensor(
                list(top_p) if top_p is not None else [1.0] * batch, dtype=torch.float32, device=dev
            ),
            seeds=None
            if seeds is None
            else torch.tensor([-1 if s is None else s for s in seeds], dtype=torch.int64, device=dev),
            positions=None
            if positions is None
            else torch.tensor(list(positions), dtype=torch.int64, device=dev),
        )

    @classmethod
    def greedy(cls, batch_size: int, device: DeviceLike = None) -> SamplingMetadata:
        """All requests greedy (temperature 0)."""
        return cls.from_lists([0.0] * batch_size, device=device)

    @classmethod
    def random(
        cls,
        batch_size: int,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        position: int = 0,
        device: DeviceLike = None,
    ) -> SamplingMetadata:
        """All requests sampled with the same parameters (and the same seed when given)."""
        return cls.from_lists(
            [temperature] * batch_size,
            [top_k] * batch_size,
            [top_p] * batch_size,
            None if seed is None else [seed] * batch_size,
            [position] * batch_size,
            device=device,
        )


__all__ = ["PLACEHOLDER_TOKEN_ID", "SamplingMetadata", "SpecDecodeMetadata"]
