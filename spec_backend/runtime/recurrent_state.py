"""Per-slot recurrent state of linear-attention layers, rolled back by construction.

A ``RecurrentState`` sits in the ragged cache's layer list at each linear-attention layer's index (the
attention layers keep ``RaggedKVLayer``). It holds, for every slot, the layer's conv window
``[C, w-1]`` (model dtype) and its recurrent state (float32; Gated DeltaNet ``[Hv, Dk, Dv]``, Mamba-2
``[H, P, N]``), allocated once.

One step: the cache's ``begin_step`` tells each state layer the step's slots and their lengths before
the step (``begin``); the layer's forward reads the slots' windows and states, computes every query
column with padding columns masked (``runtime.mixers`` glossary) and stores the state after each row's
last valid column: a speculative step has thereby advanced every slot past all its drafts. ``record``
also copies what a rollback needs into per-slot buffers allocated once: the conv inputs, the state
before the step (``snapshot``) and the recurrence's inputs of the step's first ``reach`` columns. Being
copies, a captured graph's replay refreshes them whichever graph size runs (a Python attribute set
during capture would keep the capture's tensors). When the engine then truncates a slot to the positions
it keeps (``RaggedKVCache.truncate``), ``rollback`` recomputes that slot's state from the state before
the step over the kept positions only (``replay``), and cuts its conv window from the recorded inputs:
the slot holds exactly what plain decoding of the kept tokens would hold. Only the last step can be
rolled back, and only its first ``reach`` positions kept; a truncation further back is refused.

Slots: ``add_slot`` zeroes the new slot (a fresh request starts from zero state), ``move_slot`` copies
a slot and forgets the step record of both slots involved.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from spec_backend.step import StepBatch, StepPlanned


@dataclass(frozen=True)
class RecurrentSpec:
    """Shape of one linear-attention layer's state: conv channels ``C`` and width ``w``, and the
    recurrent state's shape per slot."""

    conv_dim: int
    conv_width: int
    state_shape: tuple[int, ...]
    #: per position, the shape of each input of the recurrence a rollback replays (``Replay``'s order)
    inputs: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def from_config(cls, config: Any) -> RecurrentSpec:
        """From a (text) config: Qwen3-Next / Qwen3.5 ``linear_*`` fields, or Mamba-2 ``mamba_*`` ones."""
        inputs: tuple[tuple[int, ...], ...]
        if getattr(config, "linear_num_value_heads", None):
            hk, hv = int(config.linear_num_key_heads), int(config.linear_num_value_heads)
            dk, dv = int(config.linear_key_head_dim), int(config.linear_value_head_dim)
            inputs = ((hk, dk), (hk, dk), (hv, dv), (hv,), (hv,))  # query, key, value, g, beta
            return cls(2 * hk * dk + hv * dv, int(config.linear_conv_kernel_dim), (hv, dk, dv), inputs)
        if getattr(config, "mamba_n_heads", None):  # Bamba, Granite-4.0-H
            heads, state = int(config.mamba_n_heads), int(config.mamba_d_state)
            inner = int(config.mamba_expand) * int(config.hidden_size)
            groups = int(config.mamba_n_groups)
            conv_dim = inner + 2 * groups * state
            inputs = ((heads, inner // heads), (heads,), (groups, state), (groups, state))  # x, dt, B, C
            return cls(conv_dim, int(config.mamba_d_conv), (heads, inner // heads, state), inputs)
        if getattr(config, "mamba_num_heads", None):  # Nemotron-H
            heads, head_dim = int(config.mamba_num_heads), int(config.mamba_head_dim)
            state = int(config.ssm_state_size)
            groups = int(config.n_groups)
            conv_dim = heads * head_dim + 2 * groups * state
            inputs = ((heads, head_dim), (heads,), (groups, state), (groups, state))  # x, dt, B, C
            return cls(conv_dim, int(config.conv_kernel), (heads, head_dim, state), inputs)
        raise ValueError(
            f"{type(config).__name__} declares linear-attention layers but neither Gated DeltaNet "
            "(linear_num_value_heads) nor Mamba-2 (mamba_n_heads / mamba_num_heads) state sizes"
        )

    def bytes_per_slot(self, dtype: torch.dtype, reach: int) -> int:
        """One slot's conv window and step record (``dtype``), recurrent state and the state before the
        step (float32), and ``reach`` positions of recurrence inputs (float32)."""
        elem = torch.empty((), dtype=dtype).element_size()
        conv = self.conv_dim * (2 * (self.conv_width - 1) + reach) * elem
        return conv + 4 * (2 * math.prod(self.state_shape) + reach * sum(map(math.prod, self.inputs)))


#: ``replay(inputs, initial)``: the state after the positions of ``inputs`` (each ``[1, keep, ...]``,
#: ``RecurrentSpec.inputs``' order) from ``initial`` float32 ``[1, *state_shape]``; float32, same shape
Replay = Callable[[tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]


class RecurrentState:
    """One linear-attention layer's per-slot state (see the module docstring)."""

    is_sliding = False
    is_compileable = True
    is_initialized = True
    supports_early_init = False
    is_croppable = True

    def __init__(
        self,
        owner: StepPlanned,
        spec: RecurrentSpec,
        num_slots: int,
        dtype: torch.dtype,
        device: Any,
        reach: int,
    ) -> None:
        self.owner = owner
        self.spec = spec
        self.reach = reach  # most positions a rollback may keep of one step
        width, f32 = spec.conv_width - 1, torch.float32
        self.conv = torch.zeros((num_slots, spec.conv_dim, width), dtype=dtype, device=device)  # [S, C, w-1]
        shape = (num_slots, *spec.state_shape)
        self.recurrent = torch.zeros(shape, dtype=f32, device=device)  # [S, *state_shape]
        # the step record: states before it, windows and conv inputs, recurrence inputs
        self.before = torch.zeros(shape, dtype=f32, device=device)  # [S, *state_shape]
        self.conv_before = torch.zeros((num_slots, spec.conv_dim, width + reach), dtype=dtype, device=device)
        self.inputs = [torch.zeros((num_slots, reach, *s), dtype=f32, device=device) for s in spec.inputs]
        self.replay: Replay | None = None
        self._base: dict[int, tuple[int, int]] = {}  # slot -> (length before the step, query len)

    # -- one step ------------------------------------------------------------------------------------
    def begin(self, batch: StepBatch, lengths_before: list[int]) -> None:
        """The step's slots and each one's length before it (host values, before the forward)."""
        self._base = {
            batch.start + b: (lengths_before[batch.start + b], q) for b, q in enumerate(batch.query_lens_host)
        }

    def _rows(self, bsz: int) -> slice:
        plan = self.owner.plan
        if plan is None:
            raise RuntimeError("a Gated DeltaNet layer ran outside a step: call begin_step() first")
        return slice(plan.start, plan.start + bsz)

    def conv_windows(self, bsz: int) -> torch.Tensor:
        """The step's slots' conv windows ``[B, C, w-1]``."""
        return self.conv[self._rows(bsz)]

    def snapshot(self, bsz: int) -> torch.Tensor:
        """The step's slots' recurrent states, copied into the step record: float32
        ``[B, *state_shape]`` (a view of the record, which the step does not modify)."""
        rows = self._rows(bsz)
        self.before[rows] = self.recurrent[rows]
        return self.before[rows]

    def convolve(
        self, mixed: torch.Tensor, conv: Any, act: Callable[[torch.Tensor], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's causal depthwise convolution (``conv``, an ``nn.Conv1d``, then ``act``) over the
        step's inputs ``mixed`` ``[B, Q, C]`` after each slot's window: returns the windows and inputs
        ``[B, C, w-1+Q]`` (for ``record``) and the outputs ``[B, Q, C]`` (``mixed``'s dtype)."""
        full = torch.cat([self.conv_windows(mixed.shape[0]), mixed.transpose(1, 2)], dim=-1)
        weight = conv.weight  # [C, 1, w]
        out = torch.nn.functional.conv1d(full.to(weight.dtype), weight, conv.bias, groups=weight.shape[0])
        return full, act(out).to(mixed.dtype).transpose(1, 2)

    def valid_columns(self, q_len: int) -> torch.Tensor:
        """``[B, Q]`` bool: the query columns that hold a token of the step."""
        plan = self.owner.plan
        assert plan is not None
        cols = torch.arange(q_len, device=plan.query_lens.device)  # [Q]
        return cols[None, :] < plan.query_lens[:, None]

    def record(
        self, conv_full: torch.Tensor, inputs: tuple[torch.Tensor, ...], final: torch.Tensor, replay: Replay
    ) -> None:
        """Store each row's state after its last valid column (``final`` ``[B, *state_shape]``) and its
        new conv window, and the step record: ``conv_full`` ``[B, C, w-1+Q]`` (the windows before the
        step, then its conv inputs) and the recurrence's ``inputs`` (each ``[B, Q, ...]``) of the first
        ``reach`` columns; ``replay`` recomputes a state from them."""
        plan = self.owner.plan
        assert plan is not None
        bsz, width = final.shape[0], self.conv.shape[2]
        rows = self._rows(bsz)
        self.recurrent[rows] = final
        idx = plan.query_lens[:bsz, None] + torch.arange(width, device=final.device)  # [B, w-1]
        window = conv_full.gather(2, idx[:, None, :].expand(bsz, conv_full.shape[1], width))  # [B, C, w-1]
        self.conv[rows] = window.to(self.conv.dtype)
        n = min(conv_full.shape[2] - width, self.reach)  # recorded columns
        self.conv_before[rows, :, : width + n] = conv_full[:, :, : width + n].to(self.conv.dtype)
        for buffer, tensor in zip(self.inputs, inputs, strict=True):
            buffer[rows, :n] = tensor[:, :n].float()
        self.replay = replay

    # -- rollback and slots ----------------------------------------------------------------------------
    @torch.inference_mode()
    def rollback(self, slot: int, current: int, length: int) -> None:
        """Put slot ``slot`` (holding ``current`` positions) back to ``length``: recompute its state over
        the positions of the last step it keeps."""
        if length == current:
            return
        base, q = self._base.get(slot, (current, 0))
        keep = length - base
        if self.replay is None or not 0 <= keep < q or keep > self.reach:
            raise RuntimeError(
                f"the recurrent state of slot {slot} ({current} positions) cannot roll back to {length}: "
                f"only the first {self.reach} positions of the last step can be kept ({base}..{base + q})"
            )
        one = slice(slot, slot + 1)
        kept = tuple(buffer[one, :keep] for buffer in self.inputs)
        state = self.before[one] if keep == 0 else self.replay(kept, self.before[one])  # [1, *state_shape]
        self.recurrent[slot] = state[0]
        self.conv[slot] = self.conv_before[slot, :, keep : keep + self.conv.shape[2]]
        self._base[slot] = (base, keep)

    def add_slot(self, slot: int) -> None:
        """A fresh slot starts from zero state."""
        self.conv[slot].zero_()
        self.recurrent[slot].zero_()
        self._base.pop(slot, None)

    def move_slot(self, src: int, dst: int) -> None:
        self.conv[dst] = self.conv[src]
        self.recurrent[dst] = self.recurrent[src]
        self._base.pop(src, None)
        self._base.pop(dst, None)

    def reset(self) -> None:
        self._base = {}

    def zero_all(self) -> None:
        self.conv.zero_()
        self.recurrent.zero_()


__all__ = ["RecurrentSpec", "RecurrentState", "Replay"]
