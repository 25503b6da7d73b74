"""Opt-in int8 weight-only linear layers on CPU (``LLM(quantization="int8")``), with torch's int8 kernel.

Each output row's weights become int8 codes with one scale per row (``scale = max|w| / 127``,
``w ≈ scale · q``): a step reads one byte per weight instead of four. Like the int4 path, torch's kernel
is fast only with bfloat16 activations, so activations and scales are rounded to bfloat16 and the output
returned as float32. **Lossy** against the float32 model (rounding to 255 levels per row, then
bfloat16); ``tests/unit/test_weight_only_quantization.py`` bounds one layer's error.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from spec_backend.cpu.int4_linear import PackedLinear
from spec_backend.cpu.vocab_projection import output_embedding, replace_modules


class Int8Linear(PackedLinear):
    """An ``nn.Linear`` as int8 codes with a per-row scale (module docstring)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        weight = linear.weight.detach().float()  # [N, K]
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127  # [N]
        self.register_buffer("codes", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(torch.bfloat16))

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(rows, self.codes, self.scales)
        return out


def install_int8_linears(model: Any) -> int:
    """Replace every CPU ``nn.Linear`` of ``model`` but the output embedding (drafters and the engine read
    its weight; it stays float32) by an ``Int8Linear``; returns how many were replaced."""
    head = output_embedding(model)
    swaps = [
        (name, module)
        for name, module in model.named_modules()
        if type(module) is nn.Linear and module is not head and module.weight.device.type == "cpu"
    ]
    return replace_modules(model, [(name, Int8Linear(module)) for name, module in swaps])


__all__ = ["Int8Linear", "install_int8_linears"]
