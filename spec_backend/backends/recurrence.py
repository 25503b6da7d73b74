"""The gated delta rule (Gated DeltaNet linear attention): the backend-neutral contract and the
plain-torch reference every backend must match (``runtime.gated_delta`` has the glossary).

A masked position (``g = 0``, ``beta = 0``) leaves the state unchanged bit for bit: padding columns and
rejected drafts pass through.
"""

from __future__ import annotations

from typing import Protocol

import torch

#: steps longer than this (prefill) use the chunked form; shorter ones (decode, verify) the token loop
CHUNKED_MIN_TOKENS = 32
#: L2-normalisation epsilon of queries and keys (transformers' and FLA's)
_L2_EPS = 1e-6


class GatedDeltaOps(Protocol):
    """The gated delta rule over a padded batch: ``query``/``key`` ``[B, Q, Hk, Dk]``, ``value``
    ``[B, Q, Hv, Dv]``, ``g``/``beta`` ``[B, Q, Hv]`` (masked positions zero), ``state`` float32
    ``[B, Hv, Dk, Dv]`` (not modified); returns the outputs ``[B, Q, Hv, Dv]`` (query dtype) and the
    state after the last position, float32 ``[B, Hv, Dk, Dv]``."""

    def scan(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + _L2_EPS)


class ReferenceGatedDelta:
    """Plain torch: one token at a time for short steps, transformers' chunked form for long ones."""

    def scan(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if query.shape[1] > CHUNKED_MIN_TOKENS:
            from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

            out, final = torch_chunk_gated_delta_rule(
                query, key, value, g=g, beta=beta, initial_state=state.clone(),
                output_final_state=True, use_qk_l2norm_in_kernel=True,
            )  # fmt: skip
            return out, final.float()
        groups = value.shape[2] // key.shape[2]
        q, k = (x.repeat_interleave(groups, dim=2) if groups > 1 else x for x in (query, key))
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


REFERENCE_GATED_DELTA = ReferenceGatedDelta()


__all__ = ["CHUNKED_MIN_TOKENS", "REFERENCE_GATED_DELTA", "GatedDeltaOps", "ReferenceGatedDelta"]
