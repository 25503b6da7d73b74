"""Medusa heads (``method="medusa"``), loaded from vLLM's or FasterDecoding's safetensors layout.

Head ``i`` is a stack of residual blocks ``x + SiLU(W x + b)`` followed by its own LM head; all heads
read the target's post-norm hidden state of the last committed token ``t`` and head ``i`` predicts
token ``t+2+i`` (token ``t+1`` is the target's own bonus token). No attention, no cache.

Layouts (safetensors only; FasterDecoding's ``medusa_lm_head.pt`` is a pickle and is refused):

* vLLM: ``config.json`` ``{"model_type": "medusa", "num_heads", "num_hidden_layers", "medusa_fc_bias"}``;
  tensors ``blocks.{i}.layers.{j}.weight/bias``, ``lm_heads.{i}.weight`` (an optional ``medusa_heads.``
  prefix is stripped);
* FasterDecoding: ``config.json`` ``{"medusa_num_heads", "medusa_num_layers"}``; tensors
  ``{i}.{j}.linear.weight/bias`` and ``{i}.{L}.weight`` (the head's LM head, ``L`` = layers).
"""

from __future__ import annotations

import re

import torch

from spec_backend.models.checkpoint import check_tensors, module_shapes, read_config, read_tensors


class MedusaHeads(torch.nn.Module):
    """``num_heads`` heads of ``num_layers`` residual blocks and an LM head each."""

    def __init__(self, hidden: int, vocab: int, num_heads: int, num_layers: int, bias: bool) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            [
                torch.nn.ModuleList([torch.nn.Linear(hidden, hidden, bias=bias) for _ in range(num_layers)])
                for _ in range(num_heads)
            ]
        )
        self.lm_heads = torch.nn.ModuleList(
            [torch.nn.Linear(hidden, vocab, bias=False) for _ in range(num_heads)]
        )

    @property
    def num_heads(self) -> int:
        return len(self.lm_heads)

    def head_logits(self, i: int, hidden: torch.Tensor) -> torch.Tensor:  # [B, H] -> [B, V]
        """Head ``i``: its residual blocks ``x + SiLU(W x + b)``, then its LM head."""
        x = hidden
        block = self.blocks[i]
        assert isinstance(block, torch.nn.ModuleList)
        for linear in block:
            x = x + torch.nn.functional.silu(linear(x))
        logits: torch.Tensor = self.lm_heads[i](x)
        return logits


def _rename(name: str) -> str:
    """A checkpoint tensor name in ``MedusaHeads``' names (vLLM or FasterDecoding layout)."""
    name = name.removeprefix("medusa_heads.")
    m = re.fullmatch(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)", name)
    if m:
        return f"blocks.{m[1]}.{m[2]}.{m[3]}"
    m = re.fullmatch(r"(\d+)\.(\d+)\.linear\.(weight|bias)", name)
    if m:
        return f"blocks.{m[1]}.{m[2]}.{m[3]}"
    m = re.fullmatch(r"(\d+)\.(\d+)\.weight", name)
    if m:
        return f"lm_heads.{m[1]}.weight"
    return name


def load_medusa(path: str, hidden: int, vocab: int) -> MedusaHeads:
    """Load Medusa heads for a target with ``hidden`` size and ``vocab`` tokens (checked)."""
    cfg = read_config("Medusa", path)
    heads = cfg.get("num_heads", cfg.get("medusa_num_heads"))
    layers = cfg.get("num_hidden_layers", cfg.get("medusa_num_layers"))
    if not isinstance(heads, int) or not isinstance(layers, int) or heads < 1 or layers < 0:
        raise ValueError(
            f"Medusa config {path!r} needs num_heads/num_hidden_layers (or medusa_num_*), got {cfg}"
        )
    truncated = cfg.get("truncated_vocab_size")
    if isinstance(truncated, int) and truncated != vocab:
        raise NotImplementedError(
            f"Medusa heads with a truncated vocabulary ({truncated} of {vocab}) are not supported yet"
        )
    tensors = read_tensors("Medusa", path, _rename)
    bias = any(k.startswith("blocks.") and k.endswith(".bias") for k in tensors)
    model = MedusaHeads(hidden, vocab, heads, layers, bias)
    expected = module_shapes(model)
    check_tensors("Medusa", path, expected, tensors)
    model.load_state_dict(tensors)
    return model


__all__ = ["MedusaHeads", "load_medusa"]
