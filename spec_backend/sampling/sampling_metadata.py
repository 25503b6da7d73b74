"""How each request of a verification step samples: ``SamplingMetadata`` (temperature, top-k, top-p,
seeds and positions, one ``[B]`` tensor each) and the seed check every entry point shares."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spec_backend.sampling.errors import SamplerInputError
from spec_backend.sampling.rng import MAX_SEED

DeviceLike = torch.device | str | None

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


@dataclass(frozen=True)
class SamplingFlags:
    """Host-side facts about a batch's sampling parameters that the sampler branches on (see
    ``SamplingMetadata``); ``of`` computes them from host values, with no device read."""

    all_greedy: bool
    all_random: bool
    apply_top_k: bool
    apply_top_p: bool
    has_seeds: bool
    max_top_k: int | None

    @classmethod
    def of(
        cls,
        temperature: Sequence[float],
        top_k: Sequence[int],
        top_p: Sequence[float],
        seeds: Sequence[int],
    ) -> SamplingFlags:
        """Flags of valid values (``seeds``: -1 unseeded), as ``SamplingMetadata``'s checks derive them."""
        sampled = [t > 0 for t in temperature]
        k_sampled = [k for k, s in zip(top_k, sampled, strict=True) if s]
        apply_top_k = any(k > 0 for k in k_sampled)
        every_row_k = apply_top_k and all(k > 0 for k in k_sampled)
        return cls(
            all_greedy=not any(sampled),
            all_random=all(sampled),
            apply_top_k=apply_top_k,
            apply_top_p=any(p < 1 for p, s in zip(top_p, sampled, strict=True) if s),
            has_seeds=any(seed >= 0 for seed in seeds),
            max_top_k=max(k_sampled) if every_row_k else None,
        )


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

    @classmethod
    def prevalidated(
        cls,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        seeds: torch.Tensor,
        positions: torch.Tensor,
        flags: SamplingFlags,
    ) -> SamplingMetadata:
        """Tensors whose values were checked when each request was admitted (an engine's per-slot state:
        float32 temperature, int64 top_k, float32 top_p, int64 seeds and positions, all [B] on one device),
        with their ``flags`` computed on the host (``SamplingFlags.of``): nothing is read back from the
        device."""
        self = cls.__new__(cls)
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.seeds, self.positions = seeds, positions
        self.all_greedy, self.all_random = flags.all_greedy, flags.all_random
        self.apply_top_k, self.apply_top_p, self.has_seeds = (
            flags.apply_top_k,
            flags.apply_top_p,
            flags.has_seeds,
        )
        self.max_top_k = flags.max_top_k
        return self

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


__all__ = ["MAX_SEED", "SamplingFlags", "SamplingMetadata", "check_seed"]
