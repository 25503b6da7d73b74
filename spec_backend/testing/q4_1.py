"""GGUF Q4_1 round trips for tests: weights quantized the way llama.cpp's quantizer does it, then
de-quantized to float32 the way transformers loads a Q4_1 GGUF (``w = d·q + m`` with fp16 ``d``, ``m``)."""

from __future__ import annotations

import os
from typing import Any

import torch

GROUP = 32


def q4_1_round_trip(weight: torch.Tensor) -> torch.Tensor:
    """``weight [N, K]`` (K a multiple of 32) as a de-quantized Q4_1 tensor, float32."""
    n, k = weight.shape
    blocks = weight.detach().float().reshape(n, k // GROUP, GROUP)  # [N, G, 32]
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)  # [N, G]
    d = ((high - low) / 15).to(torch.float16)  # stored scale
    m = low.to(torch.float16)  # stored minimum
    inverse = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = torch.clamp(
        torch.floor((blocks - m.float()[..., None]) * inverse[..., None] + 0.5), 0, 15
    )  # [N, G, 32]
    return (d.float()[..., None] * q + m.float()[..., None]).reshape(n, k)


def make_q4_1_model(
    directory: str | os.PathLike[str], arch: str = "llama", seed: int = 0, **overrides: Any
) -> str:
    """A tiny model (``engine.tiny``, its config changed by ``overrides``) whose decoder linear weights are
    Q4_1 round trips, float32, saved as safetensors: what transformers makes of a Q4_1 GGUF."""
    from transformers import AutoModelForCausalLM

    from spec_backend.engine.tiny import make_tiny_model

    path = make_tiny_model(directory, arch, seed=seed, with_tokenizer=False, **overrides)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            for linear in [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]:
                linear.weight.copy_(q4_1_round_trip(linear.weight))
    model.save_pretrained(path)
    return str(path)


__all__ = ["make_q4_1_model", "q4_1_round_trip"]
