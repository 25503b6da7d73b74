"""Linear-attention token mixers on the engine's ragged batch, with per-slot state that rolls back.

Glossary:

- *mixer*: a decoder layer's token-mixing module that is not attention: Gated DeltaNet (Qwen3-Next,
  Qwen3.5: ``layer.linear_attn``) or a Mamba-2 mixer (Bamba, Granite-4.0-H: ``layer.mamba``). Each has a
  short causal depthwise convolution and a recurrence (``backends.recurrence``).
- *conv window*: the ``w - 1`` convolution inputs before a token; a slot keeps those of its last token.
- *masked position*: a padding column of the ``[B, Q]`` step (``col >= query_len``). Its decay and
  update are zeroed, so the recurrence passes the state through it unchanged, bit for bit.

``install_mixers`` replaces transformers' mixer modules by ours (``MIXERS``, the one registry of the mixer
kinds the engine runs); each wrapper shares the original's parameters, reads its slots' state from the
cache's ``RecurrentState`` layer, writes the state after each row's last token and records a replay of
its recurrence, which the cache uses to roll rejected drafts back (``runtime.recurrent_state``). The
recurrence itself is the backend's (``Backend.recurrence_ops``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from spec_backend.backends.recurrence import RecurrenceOps
from spec_backend.runtime.recurrent_state import RecurrentState


def _has(module: object, names: tuple[str, ...]) -> bool:
    return all(hasattr(module, n) for n in names)


def is_gated_delta_module(module: object) -> bool:
    """A Gated DeltaNet layer of a layout ``RaggedGatedDeltaNet`` reads (fused or split projections)."""
    fused = _has(module, ("in_proj_qkvz", "in_proj_ba", "fix_query_key_value_ordering"))
    split = _has(module, ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))
    common = _has(module, ("conv1d", "A_log", "dt_bias", "norm", "out_proj", "layer_idx", "head_k_dim"))
    return type(module).__name__.endswith("GatedDeltaNet") and common and (fused or split)


def is_mamba2_module(module: object) -> bool:
    """A Mamba-2 mixer with one input projection ``[gate, x B C, dt]`` (Bamba, Granite-4.0-H)."""
    names = ("in_proj", "conv1d", "A_log", "dt_bias", "D", "norm", "out_proj", "layer_idx", "n_groups")
    sizes = ("intermediate_size", "conv_dim", "num_heads", "head_dim", "ssm_state_size", "time_step_limit")
    return _has(module, names + sizes)


def _state_layer(cache: Any, kwargs: dict[str, Any], layer_idx: int) -> RecurrentState:
    """The layer's state in the engine's cache. transformers hands the cache to a mixer as ``cache``
    (5.18 and later) or ``cache_params`` (5.17 and earlier)."""
    cache = kwargs.get("cache_params") if cache is None else cache
    layer = cache.layers[layer_idx] if cache is not None else None
    if not isinstance(layer, RecurrentState):
        raise RuntimeError(
            f"linear-attention layer {layer_idx} runs on the engine's cache only (its recurrent state lives "
            f"there), got {type(cache).__name__}"
        )
    return layer


class _Mixer(nn.Module):
    def __init__(self, inner: nn.Module, ops: RecurrenceOps) -> None:
        super().__init__()
        self.inner = inner
        self.ops = ops
        self.layer_idx = int(inner.layer_idx)  # type: ignore[arg-type]
        from transformers.activations import ACT2FN

        self.act: Callable[[torch.Tensor], torch.Tensor] = ACT2FN[str(inner.activation)]


class RaggedGatedDeltaNet(_Mixer):
    """A Gated DeltaNet layer (transformers' module ``inner``) on the engine's cache."""

    def _project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``hidden`` ``[B, Q, E]`` -> conv input ``[B, Q, C]``, ``z`` ``[B, Q, Hv, Dv]``, ``b``/``a``
        ``[B, Q, Hv]``, for either projection layout."""
        m: Any = self.inner
        bsz, q_len = hidden.shape[:2]
        if hasattr(m, "in_proj_qkvz"):
            qkvz, ba = m.in_proj_qkvz(hidden), m.in_proj_ba(hidden)
            query, key, value, z, b, a = m.fix_query_key_value_ordering(qkvz, ba)
            mixed = torch.cat([x.reshape(bsz, q_len, -1) for x in (query, key, value)], dim=-1)
            return mixed, z, b, a
        z = m.in_proj_z(hidden).reshape(bsz, q_len, -1, m.head_v_dim)
        return m.in_proj_qkv(hidden), z, m.in_proj_b(hidden), m.in_proj_a(hidden)

    def forward(self, hidden_states: torch.Tensor, cache: Any = None, **kwargs: Any) -> torch.Tensor:
        m: Any = self.inner  # kwargs' attention mask is unread: the step plan masks padding columns
        layer = _state_layer(cache, kwargs, self.layer_idx)
        bsz, q_len = hidden_states.shape[:2]
        mixed, z, b, a = self._project(hidden_states)
        full, conved = layer.convolve(mixed, m.conv1d, self.act)  # [B, C, w-1+Q], [B, Q, C]
        query, key, value = torch.split(conved, [m.key_dim, m.key_dim, m.value_dim], dim=-1)
        query = query.reshape(bsz, q_len, -1, m.head_k_dim)  # [B, Q, Hk, Dk]
        key = key.reshape(bsz, q_len, -1, m.head_k_dim)  # [B, Q, Hk, Dk]
        value = value.reshape(bsz, q_len, -1, m.head_v_dim)  # [B, Q, Hv, Dv]
        valid = layer.valid_columns(q_len)[..., None]  # [B, Q, 1]
        beta = b.sigmoid() * valid.to(b.dtype)  # [B, Q, Hv]
        g = -m.A_log.float().exp() * F.softplus(a.float() + m.dt_bias) * valid.float()  # [B, Q, Hv]
        initial = layer.snapshot(bsz)  # [B, Hv, Dk, Dv]
        out, final = self.ops.gated_delta(query, key, value, g, beta, initial)
        layer.record(full, (query, key, value, g, beta), final, self.replay)
        out = m.norm(out.reshape(-1, m.head_v_dim), z.reshape(-1, m.head_v_dim))  # [B*Q*Hv, Dv]
        return m.out_proj(out.reshape(bsz, q_len, -1))  # type: ignore[no-any-return]

    def replay(self, inputs: tuple[torch.Tensor, ...], initial: torch.Tensor) -> torch.Tensor:
        """The state after ``inputs`` (query, key, value, g, beta), from ``initial``."""
        query, key, value, g, beta = inputs
        return self.ops.gated_delta(query, key, value, g, beta, initial)[1]


class RaggedMamba2Mixer(_Mixer):
    """A Mamba-2 mixer (transformers' module ``inner``) on the engine's cache."""

    def forward(self, hidden_states: torch.Tensor, cache: Any = None, **kwargs: Any) -> torch.Tensor:
        m: Any = self.inner  # kwargs' attention mask is unread: the step plan masks padding columns
        layer = _state_layer(cache, kwargs, self.layer_idx)
        bsz, q_len = hidden_states.shape[:2]
        sizes = [m.intermediate_size, m.conv_dim, m.num_heads]
        gate, xbc, dt = m.in_proj(hidden_states).split(sizes, dim=-1)  # [B, Q, I], [B, Q, C], [B, Q, H]
        full, conved = layer.convolve(xbc, m.conv1d, self.act)  # [B, C, w-1+Q], [B, Q, C]
        groups = m.n_groups * m.ssm_state_size
        x, b, c = torch.split(conved, [m.intermediate_size, groups, groups], dim=-1)
        x = x.reshape(bsz, q_len, m.num_heads, m.head_dim)  # [B, Q, H, P]
        b = b.reshape(bsz, q_len, m.n_groups, m.ssm_state_size)  # [B, Q, G, N]
        c = c.reshape(bsz, q_len, m.n_groups, m.ssm_state_size)  # [B, Q, G, N]
        low, high = m.time_step_limit
        dt = torch.clamp(F.softplus(dt.float() + m.dt_bias.float()), min=low, max=high)  # [B, Q, H]
        dt = dt * layer.valid_columns(q_len)[..., None].float()
        initial = layer.snapshot(bsz)  # [B, H, P, N]
        y, final = self._scan((x, dt, b, c), initial)
        layer.record(full, (x, dt, b, c), final, self.replay)
        y = m.norm(y.reshape(bsz, q_len, -1), gate)  # [B, Q, I]
        return m.out_proj(y.to(hidden_states.dtype))  # type: ignore[no-any-return]

    def _scan(
        self, inputs: tuple[torch.Tensor, ...], initial: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The recurrence over ``inputs`` (x, dt, B, C) from ``initial``: outputs and final state."""
        m: Any = self.inner
        x, dt, b, c = inputs
        a = -torch.exp(m.A_log.float())  # [H]
        return self.ops.ssd(x, dt, a, b, c, m.D, initial)

    def replay(self, inputs: tuple[torch.Tensor, ...], initial: torch.Tensor) -> torch.Tensor:
        """The state after ``inputs`` (x, dt, B, C), from ``initial``."""
        return self._scan(inputs, initial)[1]


#: the mixer kinds the engine runs: (name, recognizer, wrapper)
MIXERS: tuple[tuple[str, Callable[[object], bool], type[_Mixer]], ...] = (
    ("Gated DeltaNet", is_gated_delta_module, RaggedGatedDeltaNet),
    ("Mamba-2", is_mamba2_module, RaggedMamba2Mixer),
)


def _entry(module: object) -> tuple[str, type[_Mixer]] | None:
    """``module``'s ``MIXERS`` name and wrapper, or ``None`` when the engine does not run it."""
    return next(((name, wrapper) for name, known, wrapper in MIXERS if known(module)), None)


def mixer_kind(module: object) -> str | None:
    """The ``MIXERS`` name of ``module``, or ``None`` when the engine does not run it."""
    entry = _entry(module)
    return entry[0] if entry is not None else None


def install_mixers(model: nn.Module, ops: RecurrenceOps) -> int:
    """Replace every mixer ``MIXERS`` knows under ``model`` by its wrapper (parameters shared); return
    how many."""
    swaps = [(name, entry[1]) for name, module in model.named_modules() if (entry := _entry(module))]
    for name, wrapper in swaps:
        model.set_submodule(name, wrapper(model.get_submodule(name), ops))
    return len(swaps)


__all__ = [
    "MIXERS",
    "RaggedGatedDeltaNet",
    "RaggedMamba2Mixer",
    "install_mixers",
    "is_gated_delta_module",
    "is_mamba2_module",
    "mixer_kind",
]
