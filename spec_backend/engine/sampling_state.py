"""Per-slot sampling parameters on the device, written once when a request is admitted.

A step used to rebuild its ``SamplingMetadata`` from per-request Python lists (four host-to-device copies
and a device read of the validation flags every step). Here each live slot holds its request's
temperature, top-k, top-p and seed in ``[slots]`` device tensors, written at admission and moved by the
slot table with every other cache; a host copy of the same values gives the sampler's branch flags
(``SamplingFlags``) without reading the device. A step slices ``[start : start + B]``.

Glossary: *slot* — a request's row in every per-request cache (``runtime/slots.py``); *seed* — the
request's counter-based RNG key (``spec_backend.sampling.rng``; every engine request has one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_backend.engine.request import Request
from spec_backend.sampling.sampling_metadata import SamplingFlags, SamplingMetadata


@dataclass(frozen=True)
class _Host:
    temperature: float
    top_k: int
    top_p: float
    seed: int


_IDLE = _Host(0.0, 0, 1.0, -1)
#: the largest end a slot stores (int64; ``SamplingState.ends``)
_END_CAP = 2**62


class SamplingState:
    """The sampling parameters of every live slot (a ``SlotCache``: see the module docstring)."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.temperature = torch.zeros(capacity, dtype=torch.float32, device=device)  # [S]
        self.top_k = torch.zeros(capacity, dtype=torch.int64, device=device)  # [S]
        self.top_p = torch.ones(capacity, dtype=torch.float32, device=device)  # [S]
        self.seeds = torch.full((capacity,), -1, dtype=torch.int64, device=device)  # [S]
        #: [S] each request's tokens when ``max_tokens`` ends it (prompt + max_tokens): a step launched
        #: ahead caps its draft budget on the device (``spec_ahead.launch_ahead``)
        self.ends = torch.zeros(capacity, dtype=torch.int64, device=device)
        self._host: list[_Host] = []

    # -- SlotCache -----------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return len(self._host)

    def add_slot(self) -> int:
        if len(self._host) >= self.temperature.shape[0]:
            raise RuntimeError(f"sampling state is full ({self.temperature.shape[0]} slots)")
        self._host.append(_IDLE)
        return len(self._host) - 1

    def move_slot(self, src: int, dst: int) -> None:
        self._host[dst] = self._host[src]
        for t in (self.temperature, self.top_k, self.top_p, self.seeds, self.ends):
            t[dst] = t[src]

    def pop_slot(self) -> None:
        self._host.pop()

    def reset(self) -> None:
        self._host.clear()

    # -- the engine ----------------------------------------------------------------------------------
    def admit(self, slot: int, request: Request) -> None:
        """Write ``request``'s parameters into ``slot`` (validated by ``SamplingParams`` already)."""
        params = request.params
        host = _Host(float(params.temperature), int(params.top_k), float(params.top_p), int(request.seed))
        self._host[slot] = host
        self.temperature[slot] = host.temperature
        self.top_k[slot] = host.top_k
        self.top_p[slot] = host.top_p
        self.seeds[slot] = host.seed
        # capped: max_tokens has no upper bound (a client may send 2**63 - 1), and past max_model_len
        # any end is the same (``room_ahead`` keeps steps ahead 2(K+1) tokens short of it)
        self.ends[slot] = min(len(request.prompt_token_ids) + int(params.max_tokens), _END_CAP)

    def flags(self, start: int, batch: int) -> SamplingFlags:
        """The sampler's branch flags of slots ``start .. start + batch - 1``, from the host copy."""
        rows = self._host[start : start + batch]
        return SamplingFlags.of(
            [h.temperature for h in rows],
            [h.top_k for h in rows],
            [h.top_p for h in rows],
            [h.seed for h in rows],
        )

    def metadata(self, start: int, positions: torch.Tensor) -> SamplingMetadata:
        """The ``SamplingMetadata`` of slots ``start .. start + B - 1`` (``positions`` [B]: the absolute
        position of each request's first draft token, the RNG counter)."""
        end = start + positions.shape[0]
        flags = self.flags(start, positions.shape[0])
        return SamplingMetadata.prevalidated(
            self.temperature[start:end],
            self.top_k[start:end],
            self.top_p[start:end],
            self.seeds[start:end],
            positions,
            flags,
        )


__all__ = ["SamplingState"]
