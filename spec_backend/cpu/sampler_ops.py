"""The cpu backend's sampler ops: the reference's torch ops, and a batch of greedy requests verified by one
native call (``csrc/greedy_verify.cpp``, ``sampling.ops.GreedyOutputOps``).

Why: a greedy verify step through the composed ops is some fifty small torch calls (the draft layout,
argmax matching, the leading run, the final rows, the padded output); on the 2-core reference VM they
cost a tiny model's step about a tenth of its time. The native call gives the composed ops' output
exactly: torch's argmax (the first maximum, the first NaN of a row holding one), drafts outside
``[0, V)`` ending a request's run, the same placeholders.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from spec_backend.sampling.torch_ops import TorchSamplerOps


class CpuSamplerOps(TorchSamplerOps):
    """``TorchSamplerOps`` plus ``greedy_output`` on the native op ``greedy_op``."""

    name = "cpu"

    def __init__(self, greedy_op: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self._greedy = greedy_op

    def greedy_output(
        self,
        logits: torch.Tensor,  # [N, V]
        draft_ids: torch.Tensor,  # [T]
        target_rows: torch.Tensor,  # [T]
        bonus_rows: torch.Tensor,  # [B]
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
    ) -> torch.Tensor:  # [B, max_spec_len + 1] int32
        """``sampling.ops.GreedyOutputOps.greedy_output``, natively."""
        return self._greedy(logits, draft_ids, target_rows, bonus_rows, cu_num_draft_tokens, max_spec_len)


__all__ = ["CpuSamplerOps"]
