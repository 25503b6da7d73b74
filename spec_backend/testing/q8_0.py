"""GGUF Q8_0 round trips for tests: weights quantized the way llama.cpp's quantizer does it, then
de-quantized to float32 the way transformers loads a Q8_0 GGUF (``w = d·q`` with fp16 ``d``)."""

from __future__ import annotations

import os

import torch

GROUP = 32


def q8_0_round_trip(weight: torch.Tensor) -> torch.Tensor:
    """``weight [N, K]`` (K a multiple of 32) as a de-quantized Q8_0 tensor, float32."""
    n, k = weight.shape
    blocks = weight.detach().float().reshape(n, k // GROUP, GROUP)  # [N, G, 32]
    d = blocks.abs().amax(dim=-1) / 127  # [N, G]
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.round(blocks * inverse[..., None])  # [N, G, 32], codes in [-127, 127]
    return (d.to(torch.float16).float()[..., None] * q).reshape(n, k)


def make_q8_0_head_model(directory: str | os.PathLike[str], seed: int = 0) -> str:
    """A tiny Q4_1 model (``testing.q4_1``) whose LM head is a Q8_0 round trip: the shape of the bundled
    SmolLM2 GGUF (Q4_1 decoder layers, Q8_0 token embedding as the head), saved as safetensors."""
    from transformers import AutoModelForCausalLM

    from spec_backend.testing.q4_1 import make_q4_1_model

    path = make_q4_1_model(directory, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        head = model.lm_head.weight  # [V, H]
        head.copy_(q8_0_round_trip(head))
    model.save_pretrained(path)
    return str(path)


__all__ = ["make_q8_0_head_model", "q8_0_round_trip"]
