"""Gated DeltaNet layers (Qwen3-Next, Qwen3.5) on the engine's ragged batch, with per-slot state.

Glossary:

- *gated delta rule*: the recurrence of a linear-attention layer. Per value head, a state ``S``
  ``[d_k, d_v]`` is decayed by ``exp(g_t)``, then corrected towards ``v_t`` along ``k_t`` by
  ``beta_t``: ``S <- S e^{g_t};  S <- S + k_t (beta_t (v_t - S^T k_t))^T``, and the output is ``S^T q_t``
  (``q_t``, ``k_t`` L2-normalised, ``q_t`` scaled by ``d_k^-1/2``).
- *conv window*: the layer's short causal depthwise convolution (kernel ``w``) over the projected
  ``q, k, v`` reads the ``w - 1`` inputs before each token; a slot keeps those of its last token.
- *masked position*: a padding column of the ``[B, Q]`` step (``col >= query_len``) or, on rollback,
  a rejected draft. It gets ``g = 0`` and ``beta = 0``, so ``S e^0 + k * 0 = S`` exactly: the state
  passes through it unchanged, bit for bit.

``backends.recurrence.GatedDeltaOps`` is the backend-neutral contract for the recurrence
(``Backend.gated_delta_ops``; the reference is plain torch, a device may supply a fused kernel).
``RaggedGatedDeltaNet`` replaces transformers' module in each linear-attention decoder layer
(``install_gated_delta``); it shares the original's parameters, reads its slots' state from the
cache's ``GatedDeltaState`` layer and records what rolling back rejected drafts needs
(``runtime.recurrent_state``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from spec_backend.backends.recurrence import GatedDeltaOps
from spec_backend.runtime.recurrent_state import GatedDeltaState, StepInputs


def is_gated_delta_module(module: object) -> bool:
    """Whether ``module`` is a Gated DeltaNet layer of a layout ``RaggedGatedDeltaNet`` reads."""
    fused = all(hasattr(module, n) for n in ("in_proj_qkvz", "in_proj_ba", "fix_query_key_value_ordering"))
    split = all(hasattr(module, n) for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))
    common = all(hasattr(module, n) for n in ("conv1d", "A_log", "dt_bias", "norm", "out_proj", "layer_idx"))
    return type(module).__name__.endswith("GatedDeltaNet") and common and (fused or split)


class RaggedGatedDeltaNet(nn.Module):
    """One Gated DeltaNet layer on the engine's cache (see the module docstring); ``inner`` is
    transformers' module, whose parameters and projections it uses."""

    def __init__(self, inner: nn.Module, ops: GatedDeltaOps) -> None:
        super().__init__()
        if not is_gated_delta_module(inner):
            raise TypeError(f"{type(inner).__name__} is not a Gated DeltaNet layer this engine reads")
        self.inner = inner
        self.ops = ops
        self.layer_idx = int(inner.layer_idx)  # type: ignore[arg-type]
        from transformers.activations import ACT2FN

        self.act = ACT2FN[str(inner.activation)]

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
        del kwargs  # the attention mask: padding columns are masked from the step plan instead
        m: Any = self.inner
        layer = cache.layers[self.layer_idx] if cache is not None else None
        if not isinstance(layer, GatedDeltaState):
            raise RuntimeError(
                f"Gated DeltaNet layer {self.layer_idx} runs on the engine's cache only (its recurrent state "
                f"lives there), got {type(cache).__name__}"
            )
        mixed, z, b, a = self._project(hidden_states)
        bsz, q_len = hidden_states.shape[:2]
        full = torch.cat([layer.conv_windows(bsz), mixed.transpose(1, 2)], dim=-1)  # [B, C, w-1+Q]
        weight = m.conv1d.weight  # [C, 1, w]
        conved = F.conv1d(full.to(weight.dtype), weight, m.conv1d.bias, groups=weight.shape[0])
        conved = self.act(conved).to(hidden_states.dtype).transpose(1, 2)  # [B, Q, C]
        query, key, value = torch.split(conved, [m.key_dim, m.key_dim, m.value_dim], dim=-1)
        query = query.reshape(bsz, q_len, -1, m.head_k_dim)  # [B, Q, Hk, Dk]
        key = key.reshape(bsz, q_len, -1, m.head_k_dim)  # [B, Q, Hk, Dk]
        value = value.reshape(bsz, q_len, -1, m.head_v_dim)  # [B, Q, Hv, Dv]
        valid = layer.valid_columns(q_len).to(hidden_states.dtype)  # [B, Q]
        beta = b.sigmoid() * valid[..., None]  # [B, Q, Hv]
        g = -m.A_log.float().exp() * F.softplus(a.float() + m.dt_bias) * valid[..., None].float()
        initial = layer.states(bsz)  # [B, Hv, Dk, Dv] float32
        out, final = self.ops.scan(query, key, value, g, beta, initial)
        layer.record(StepInputs(full, query, key, value, g, beta, initial.clone()), final, self.ops)
        out = m.norm(out.reshape(-1, m.head_v_dim), z.reshape(-1, m.head_v_dim))  # [B*Q*Hv, Dv]
        return m.out_proj(out.reshape(bsz, q_len, -1))  # type: ignore[no-any-return]


def install_gated_delta(model: nn.Module, ops: GatedDeltaOps) -> int:
    """Replace every Gated DeltaNet module under ``model`` by a ``RaggedGatedDeltaNet`` sharing its
    parameters; return how many."""
    swaps = [(name, mod) for name, mod in model.named_modules() if is_gated_delta_module(mod)]
    for name, mod in swaps:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, RaggedGatedDeltaNet(mod, ops))
    return len(swaps)


__all__ = ["RaggedGatedDeltaNet", "install_gated_delta", "is_gated_delta_module"]
