"""Sampler ops on Ascend: the shared triton sampler kernels with Ascend tuning.

The verify scans and residual sampling are the same triton source the CUDA backend uses
(``spec_backend.sampling.triton_ops``), launched with the Ascend tuning: vocab blocks of 2048, the
grid capped at the vector-core count, and acceptance uniforms drawn by torch and passed in (the device
has no float64 random). Top-k / top-p filtering uses ``torch_npu.npu_top_k_top_p`` where the installed
torch_npu provides it, else the torch reference filter on the same device.

Tie rule: the reference keeps every logit equal to the k-th largest; ``npu_top_k_top_p`` keeps
exactly k. The two differ only when the k-th and (k+1)-th processed logits are exactly equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from spec_backend.backends.base import SamplerTuning
from spec_backend.sampling.triton_ops import TritonSamplerOps
from spec_backend_ascend.npu import torch_npu_module

TopKTopP = Callable[..., torch.Tensor]


class AscendSamplerOps(TritonSamplerOps):
    """``TritonSamplerOps`` whose top-k / top-p filter is the fused NPU op when available."""

    def __init__(self, tuning: SamplerTuning, top_k_top_p: TopKTopP | None) -> None:
        super().__init__(tuning)
        self.top_k_top_p = top_k_top_p

    def target_probs(
        self,
        logits: torch.Tensor,  # [N, V]
        temperature: torch.Tensor,  # [N]
        top_k: torch.Tensor,  # [N] int, 0 or >= V: off
        top_p: torch.Tensor,  # [N] float in (0, 1]
        apply_top_k: bool,
        apply_top_p: bool,
    ) -> torch.Tensor:  # [N, V] float32
        if self.top_k_top_p is None or not (apply_top_k or apply_top_p):
            return super().target_probs(logits, temperature, top_k, top_p, apply_top_k, apply_top_p)
        vocab = logits.shape[1]
        temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(torch.float32)
        scaled = logits.to(torch.float32) / temp[:, None]  # [N, V]
        k = None
        if apply_top_k:
            k64 = top_k.to(torch.int64)
            k = torch.where((k64 <= 0) | (k64 >= vocab), torch.full_like(k64, vocab), k64).to(torch.int32)
        p = top_p.to(torch.float32) if apply_top_p else None
        masked = self.top_k_top_p(scaled, p, k)  # [N, V], -inf outside each row's kept set
        return torch.softmax(masked, dim=-1)


def ascend_sampler_ops(tuning: SamplerTuning) -> AscendSamplerOps:
    """The shared triton sampler ops tuned for Ascend; needs torch_npu (raises with the cause if absent)."""
    module: Any = torch_npu_module()
    return AscendSamplerOps(tuning, getattr(module, "npu_top_k_top_p", None))
