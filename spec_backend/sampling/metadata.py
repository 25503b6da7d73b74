"""Batch metadata of one verification step: where the drafts are, and how each request samples.

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

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spec_backend.sampling.errors import SamplerInputError
from spec_backend.sampling.rng import MAX_SEED

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


_KINDS = {"float": "a floating dtype", "int": "an integer dtype"}


def check_seed(seed: object, name: str = "seed") -> int | None:
    """``seed`` if it is None or an int in ``[0, MAX_SEED]``, else a ``SamplerInputError`` with the range."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise SamplerInputError(
            f"{name} must be None (unseeded) or an int in [0, 2**63 - 1], got {seed!r}"
            + (" (-1 is not 'unseeded' here: pass None)" if seed == -1 else "")
        )
    return seed


def _checked_seed(seed: object, name: str) -> int:
    value = check_seed(seed, name)
    assert value is not None
    return value


def _check_dtype(name: str, t: torch.Tensor, kind: str) -> None:
    ok = t.is_floating_point() if kind == "float" else (not t.is_floating_point() and not t.is_complex())
    if not ok or t.dtype == torch.bool:
        raise SamplerInputError(f"SamplingMetadata.{name} must have {_KINDS[kind]}, got {t.dtype}")


def _check_python_values(name: str, values: Sequence[object] | None, kind: str) -> None:
    """Each entry an int (``kind="int"``) or a real number (``"number"``); bools are neither."""
    if values is None:
        return
    allowed = numbers.Integral if kind == "int" else numbers.Real
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, allowed):
            what = "an int" if kind == "int" else "a number"
            raise SamplerInputError(f"{name}[{i}] must be {what}, got {type(v).__name__}: {v!r}")
        if isinstance(v, numbers.Integral) and not -(2**63) <= int(v) < 2**63:
            raise SamplerInputError(f"{name}[{i}] does not fit int64, got {v!r}")


@dataclass(init=False)
class SamplingMetadata:
    """Per-request sampling parameters, all [B] tensors on the logits' device.

    * ``temperature`` [B] floating: 0 means greedy (argmax of the raw logits); must be >= 0 and finite.
    * ``top_k`` [B] integer: keep the k largest logits (ties at the k-th value kept); 0 or >= V means
      off. ``None`` (as in vLLM) means off for every request.
    * ``top_p`` [B] floating in (0, 1]: keep the smallest descending-probability prefix with mass >= top_p.
      ``None`` means off (1.0) for every request.
    * ``seeds`` [B] integer or None: a seed in [0, 2**63 - 1] makes the request reproducible; -1 (or
      ``seeds=None``) means unseeded, and a fresh 63-bit seed is drawn per call on the device. Other
      negative values are rejected.
    * ``positions`` [B] integer or None: absolute sequence position of each request's first draft token.
      It is the counter of the random numbers: **engines must pass it** for seeded requests, otherwise
      every step of a seeded request reuses the same random numbers (a warning is logged once). None
      means all zeros.

    Wrong dtypes (a float ``top_k``, float seeds, ...) are ``SamplerInputError``s naming the field.
    The constructor validates the values and records host-side flags (``all_greedy``, ``all_random``,
    ``apply_top_k``, ``apply_top_p``) with one small device-to-host copy at construction time, so the
    sampler's hot path can branch on them without synchronising; ``max_top_k`` is the largest top_k of the
    sampled rows when each of them applies top-k (``None`` otherwise). After construction ``top_k`` is an
    int64 tensor, ``top_p`` a float32 tensor, ``seeds`` and ``positions`` int64 (or None).
    """

    temperature: torch.Tensor  # [B] float
    top_k: torch.Tensor  # [B] int64
    top_p: torch.Tensor  # [B] float32
    seeds: torch.Tensor | None  # [B] int64
    positions: torch.Tensor | None  # [B] int64
    all_greedy: bool = field(init=False, default=False)
    all_random: bool = field(init=False, default=False)
    apply_top_k: bool = field(init=False, default=False)
    apply_top_p: bool = field(init=False, default=False)
    has_seeds: bool = field(init=False, default=False)
    #: the largest top_k of the sampled rows when every sampled row applies top-k (else None): lets a
    #: backend pick a top-k kernel with a k limit without reading the tensor back
    max_top_k: int | None = field(init=False, default=None)

    def __init__(
        self,
        temperature: torch.Tensor,
        top_k: torch.Tensor | None = None,
        top_p: torch.Tensor | None = None,
        seeds: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> None:
        if not isinstance(temperature, torch.Tensor):
            raise SamplerInputError(
                f"SamplingMetadata.temperature must be a tensor, got {type(temperature).__name__}"
            )
        batch = temperature.shape[0] if temperature.dim() == 1 else -1
        device = temperature.device
        self.temperature = temperature
        self.top_k = torch.zeros(max(batch, 0), dtype=torch.int64, device=device) if top_k is None else top_k
        self.top_p = torch.ones(max(batch, 0), dtype=torch.float32, device=device) if top_p is None else top_p
        self.seeds, self.positions = seeds, positions
        kinds = {"temperature": "float", "top_k": "int", "top_p": "float", "seeds": "int", "positions": "int"}
        for name, kind in kinds.items():
            t = getattr(self, name)
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise SamplerInputError(f"SamplingMetadata.{name} must be a tensor, got {type(t).__name__}")
            _check_dtype(name, t, kind)
            if t.dim() != 1 or t.shape[0] != batch:
                raise SamplerInputError(
                    f"SamplingMetadata.{name} has shape {list(t.shape)}, expected [B] with "
                    f"B={batch} (temperature's length)"
                )
        self.top_k, self.top_p = self.top_k.to(torch.int64), self.top_p.to(torch.float32)
        self.seeds = None if self.seeds is None else self.seeds.to(torch.int64)
        self.positions = None if self.positions is None else self.positions.to(torch.int64)
        self._check_values()

    def _check_values(self) -> None:
        temp = self.temperature.to(torch.float32)
        no = torch.tensor(False, device=temp.device)
        sampled = temp > 0  # [B]
        flags = torch.stack(
            [
                (temp < 0).any() | ~torch.isfinite(temp).all(),
                ((self.top_p <= 0) | (self.top_p > 1) | torch.isnan(self.top_p)).any(),
                (self.top_k < 0).any(),
                (temp == 0).all(),
                sampled.all(),
                ((self.top_k > 0) & sampled).any(),
                ((self.top_p < 1) & sampled).any(),
                (self.seeds >= 0).any() if self.seeds is not None else no,
                (self.seeds < -1).any() if self.seeds is not None else no,
                ((self.top_k == 0) & sampled).any(),
            ]
        ).to(torch.int64)
        k_sampled = torch.where(sampled, self.top_k, torch.zeros_like(self.top_k))  # [B]
        k_max = k_sampled.amax(0, keepdim=True) if k_sampled.numel() else flags.new_zeros(1)
        stats = torch.cat([flags, k_max]).tolist()  # one host copy
        if stats[0]:
            raise SamplerInputError(f"temperature must be finite and >= 0, got {self.temperature.tolist()}")
        if stats[1]:
            raise SamplerInputError(f"top_p must be in (0, 1], got {self.top_p.tolist()}")
        if stats[2]:
            raise SamplerInputError(f"top_k must be >= 0 (0 = off), got {self.top_k.tolist()}")
        if stats[8]:
            assert self.seeds is not None
            raise SamplerInputError(
                f"seeds must be in [0, 2**63 - 1], or -1 for unseeded, got {self.seeds.tolist()}"
            )
        self.all_greedy, self.all_random = bool(stats[3]), bool(stats[4])
        self.apply_top_k, self.apply_top_p, self.has_seeds = bool(stats[5]), bool(stats[6]), bool(stats[7])
        self.max_top_k = int(stats[10]) if self.apply_top_k and not stats[9] else None

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
        """Build from per-request Python values; ``None`` seeds mean unseeded.

        Values are type-checked before any tensor is made (a float ``top_k`` or a seed outside
        ``[0, 2**63 - 1]`` is a ``SamplerInputError``, never silently truncated or wrapped).
        """
        batch = len(temperature)
        dev = torch.device(device) if device is not None else torch.device("cpu")
        for name, values in (("top_k", top_k), ("top_p", top_p), ("seeds", seeds), ("positions", positions)):
            if values is not None and len(values) != batch:
                raise SamplerInputError(f"{name} has {len(values)} entries, expected B={batch}")
        for name, values, kind in (
            ("temperature", temperature, "number"),
            ("top_k", top_k, "int"),
            ("top_p", top_p, "number"),
            ("positions", positions, "int"),
        ):
            _check_python_values(name, values, kind)
        seed_list = [-1 if s is None else _checked_seed(s, f"seeds[{i}]") for i, s in enumerate(seeds or ())]

        def tensor(values: Sequence[float] | Sequence[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(list(values), dtype=dtype, device=dev)

        return cls(
            temperature=tensor(temperature, torch.float32),
            top_k=tensor(top_k if top_k is not None else [0] * batch, torch.int64),
            top_p=tensor(top_p if top_p is not None else [1.0] * batch, torch.float32),
            seeds=None if seeds is None else tensor(seed_list, torch.int64),
            positions=None if positions is None else tensor(positions, torch.int64),
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


__all__ = [
    "MAX_SEED",
    "MAX_TOKEN_ID",
    "PLACEHOLDER_TOKEN_ID",
    "SamplingMetadata",
    "SpecDecodeMetadata",
    "check_seed",
]
