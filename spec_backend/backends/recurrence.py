"""The recurrences of linear-attention layers: the backend-neutral contract and the plain-torch reference
every backend must match (``runtime.mixers`` has the glossary).

- ``gated_delta``: the gated delta rule of Gated DeltaNet (Qwen3-Next, Qwen3.5). Per value head a state
  ``S`` ``[Dk, Dv]``: ``S <- S e^{g_t};  S <- S + k_t (beta_t (v_t - S^T k_t))^T``, output ``S^T q_t``
  (``q_t``, ``k_t`` L2-normalised, ``q_t`` scaled by ``Dk^-1/2``).
- ``ssd``: the selective state-space recurrence of Mamba-2 (Bamba, Granite-4.0-H). Per head a state ``h``
  ``[P, N]``: ``h <- h e^{dt_t A} + dt_t x_t B_t^T``, output ``h C_t + D x_t``.

A masked position leaves the state unchanged bit for bit (``g = 0, beta = 0``: ``S * 1 + k * 0``;
``dt = 0``: ``h * 1 + 0``): padding columns and rejected drafts pass through.
"""

from __future__ import annotations

from typing import Protocol

import torch

#: steps longer than this (prefill) use the chunked forms; shorter ones (decode, verify) the token loop
CHUNKED_MIN_TOKENS = 32
#: chunk length of the chunked state-space form (any length gives the same result up to rounding)
SSD_CHUNK = 64
#: L2-normalisation epsilon of queries and keys (transformers' and FLA's)
_L2_EPS = 1e-6


class RecurrenceOps(Protocol):
    """Both recurrences over a padded batch of ``B`` rows and ``Q`` columns. ``state`` (float32) is not
    modified; each returns the outputs (input dtype) and the state after the last column (float32)."""

    def gated_delta(
        self,
        query: torch.Tensor,  # [B, Q, Hk, Dk]
        key: torch.Tensor,  # [B, Q, Hk, Dk]
        value: torch.Tensor,  # [B, Q, Hv, Dv]
        g: torch.Tensor,  # [B, Q, Hv] log decay (masked: 0)
        beta: torch.Tensor,  # [B, Q, Hv] (masked: 0)
        state: torch.Tensor,  # [B, Hv, Dk, Dv]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...  # [B, Q, Hv, Dv], [B, Hv, Dk, Dv]

    def ssd(
        self,
        x: torch.Tensor,  # [B, Q, H, P]
        dt: torch.Tensor,  # [B, Q, H] float32, after softplus and limits (masked: 0)
        a: torch.Tensor,  # [H] float32, negative
        b: torch.Tensor,  # [B, Q, G, N]
        c: torch.Tensor,  # [B, Q, G, N]
        d: torch.Tensor,  # [H]
        state: torch.Tensor,  # [B, H, P, N]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...  # [B, Q, H, P], [B, H, P, N]


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + _L2_EPS)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, Q, G, D]`` -> ``[B, Q, heads, D]`` (each group serves ``heads / G`` consecutive heads)."""
    groups = heads // x.shape[2]
    return x.repeat_interleave(groups, dim=2) if groups > 1 else x


class ReferenceRecurrence:
    """Plain torch: one token at a time for short steps, transformers' chunked forms for long ones."""

    def gated_delta(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        heads = value.shape[2]
        if query.shape[1] > CHUNKED_MIN_TOKENS:
            from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

            # grouped heads expanded here: transformers 5.17 and earlier expect one key per value head
            out, final = torch_chunk_gated_delta_rule(
                _heads(query, heads), _heads(key, heads), value, g=g, beta=beta, initial_state=state.clone(),
                output_final_state=True, use_qk_l2norm_in_kernel=True,
            )  # fmt: skip
            return out, final.float()
        q, k = _heads(query, heads), _heads(key, heads)
        q, k, v, g32, b32 = (x.transpose(1, 2).float() for x in (q, k, value, g, beta))  # [B, H, Q, ...]
        q, k = _l2norm(q) * q.shape[-1] ** -0.5, _l2norm(k)
        s = state.float().clone()  # [B, H, Dk, Dv]
        out = torch.empty_like(v)  # [B, H, Q, Dv]
        for t in range(q.shape[2]):
            s = s * g32[:, :, t].exp()[..., None, None]
            k_t = k[:, :, t]  # [B, H, Dk]
            delta = (v[:, :, t] - (s * k_t[..., None]).sum(dim=-2)) * b32[:, :, t, None]  # [B, H, Dv]
            s = s + k_t[..., None] * delta[..., None, :]
            out[:, :, t] = (s * q[:, :, t, :, None]).sum(dim=-2)
        return out.transpose(1, 2).to(query.dtype), s

    def ssd(
        self,
        x: torch.Tensor,
        dt: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        d: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if x.shape[1] > CHUNKED_MIN_TOKENS:
            from transformers.models.bamba.modeling_bamba import mamba2_chunk_scan

            out, final = mamba2_chunk_scan(
                x, dt, a, b, c, chunk_size=SSD_CHUNK, D=d, initial_states=state.clone(),
                return_final_states=True,
            )  # fmt: skip
            return out.to(x.dtype), final.float()
        heads = x.shape[2]
        bh, ch = _heads(b, heads).float(), _heads(c, heads).float()  # [B, Q, H, N]
        xf, s = x.float(), state.float().clone()  # [B, Q, H, P], [B, H, P, N]
        out = torch.empty_like(xf)  # [B, Q, H, P]
        for t in range(x.shape[1]):
            dt_t = dt[:, t, :, None, None]  # [B, H, 1, 1]
            s = s * torch.exp(dt_t * a[:, None, None]) + (dt_t * xf[:, t, :, :, None]) * bh[:, t, :, None, :]
            out[:, t] = (s * ch[:, t, :, None, :]).sum(dim=-1) + d.float()[:, None] * xf[:, t]
        return out.to(x.dtype), s


REFERENCE_RECURRENCE = ReferenceRecurrence()

__all__ = ["CHUNKED_MIN_TOKENS", "REFERENCE_RECURRENCE", "SSD_CHUNK", "RecurrenceOps", "ReferenceRecurrence"]
