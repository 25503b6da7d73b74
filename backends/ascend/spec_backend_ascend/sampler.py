"""Sampler ops on Ascend: the shared triton sampler kernels with Ascend tuning.

The verify scans and residual sampling are the same triton source the CUDA backend uses
(``spec_backend.sampling.triton.ops``), launched with the Ascend tuning: vocab blocks of 2048, the
grid capped at the vector-core count, and acceptance uniforms drawn by torch and passed in (the device
has no float64 random). Top-k / top-p filtering uses ``torch_npu.npu_top_k_top_p`` where the installed
torch_npu provides it, else the torch reference filter on the same device.

``npu_top_k_top_p`` (op-plugin docs, torch_npu-npu_top_k_top_p.md) keeps every value equal to the k-th
largest, as the reference does, and documents k in [1, 1024] (and <= V). The op is used only when
every k it would receive lies there, which the sampler knows on the host (``max_top_k``: every sampled
row applies top-k, the largest k at most 1024); a batch with a larger k, or with a sampled row whose
top-k is off (vLLM would pass k = V), takes the torch filter, so no CANN release can reject it or
misbehave on it. Its top-p drops values whose ascending cumulative probability is <= 1 - p (keeping the
largest); the reference keeps the smallest descending prefix with mass >= top_p: the same set except
where float rounding puts a cumulative sum exactly on the boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from spec_backend.backends.base import SamplerTuning
from spec_backend.sampling.triton.ops import TritonSamplerOps
from spec_backend_ascend.limits import TOP_K_MAX
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
        max_top_k: int | None = None,
    ) -> torch.Tensor:  # [N, V] float32
        vocab = logits.shape[1]
        k_fits = not apply_top_k or (max_top_k is not None and min(max_top_k, vocab) <= TOP_K_MAX)
        if self.top_k_top_p is None or not (apply_top_k or apply_top_p) or not k_fits:
            return super().target_probs(logits, temperature, top_k, top_p, apply_top_k, apply_top_p)
        sampled = temperature > 0  # [N] greedy rows' probabilities are never used: k = 1 is fine there
        temp = torch.where(sampled, temperature, torch.ones_like(temperature)).to(torch.float32)
        scaled = logits.to(torch.float32) / temp[:, None]  # [N, V]
        k = None
        if apply_top_k:  # every sampled row applies top-k, with k <= 1024 (checked above, on the host)
            k = torch.where(sampled, torch.clamp(top_k, max=vocab), torch.ones_like(top_k)).to(torch.int32)
        p = top_p.to(torch.float32) if apply_top_p else None  # the logits' dtype, as documented
        masked = self.top_k_top_p(scaled, p, k)  # [N, V], -inf outside each row's kept set
        return torch.softmax(masked, dim=-1)


def ascend_sampler_ops(tuning: SamplerTuning) -> AscendSamplerOps:
    """The shared triton sampler ops tuned for Ascend; needs torch_npu (raises with the cause if absent)."""
    module: Any = torch_npu_module()
    return AscendSamplerOps(tuning, getattr(module, "npu_top_k_top_p", None))
