"""EAGLE-3's first draft layer as one native call (``csrc/decoder_layer.cpp``: ``eagle3_layer``).

Why: a draft forward of the trained SmolLM2 head (one layer, int4 weights) took about 0.74 ms on the
reference machine, most of it transformers' module calls and small torch ops around products that take
a fraction of that. EAGLE-3's first layer is a Llama layer whose attention reads twice the hidden size —
``[input_norm(embedding) | hidden_norm(g)]`` — with ``g`` (or its norm, ``norm_before_residual``) as
the residual (``models/eagle3.py``), so the native decoder layer's steps apply with one more norm and
2H-wide q/k/v tiles.

Where: ``install_native_eagle3_layers`` replaces the first layer of every ``Eagle3Head`` whose
projections all run on the native Q4_1 kernel (``speculative_config["quantization"] = "int4"``: drafts only,
lossy for the drafts, never for the output) by a ``NativeEagle3Layer``; ``Eagle3Head`` calls it through
``FusedFirstLayer``'s interface. Paths as ``native_layer``: ragged inside an engine step (norms, fused
products, rotary embedding, cache write, row attention, MLP in one call), general elsewhere (the caller's
cache ``update`` and configured attention between two ops), the same result bit for bit with the row
attention kernel. ``SPEC_BACKEND_NATIVE_LAYERS=0`` turns it off with the decoder layers.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from spec_backend.cpu.native import native_op
from spec_backend.cpu.native_layer import NATIVE_LAYERS_ENV, NativeDecoderLayer, supported
from spec_backend.cpu.vocab_projection import replace_modules
from spec_backend.models.eagle3 import FusedFirstLayer
from spec_backend.step import RaggedAttentionMetadata


class NativeEagle3Layer(NativeDecoderLayer, FusedFirstLayer):
    """An EAGLE-3 head's first layer as native calls (module docstring)."""

    OPS = ("eagle3_layer", "eagle3_layer_qkv", "decoder_layer_out")

    def __init__(self, layer: Any, norm_before_residual: bool) -> None:
        super().__init__(layer)
        self.register_buffer("hidden_norm", layer.hidden_norm.weight.detach().float().contiguous())  # [H]
        self.norm_before_residual = norm_before_residual

    def forward(  # type: ignore[override]
        self,
        embeds: torch.Tensor,  # [B, Q, H] the next tokens' embeddings
        hidden: torch.Tensor,  # [B, Q, H] g
        position_embeddings: tuple[torch.Tensor, torch.Tensor],  # cos, sin [B or 1, Q, D]
        cache: Any,
        meta: RaggedAttentionMetadata | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,  # [B, Q]
    ) -> torch.Tensor:  # [B, Q, H] the first layer's output
        cos, sin = position_embeddings
        ops, ragged = self._ops, self._ragged_cache(cache, meta)
        inputs = (embeds, hidden, self.hidden_norm, cos, sin, self._weights)
        if ragged is not None and meta is not None:
            out: torch.Tensor = ops["eagle3_layer"](
                *inputs, *ragged, meta.query_lens, meta.kv_lens, *self.shape, self.self_attn.scaling,
                self.norm_before_residual,
            )  # fmt: skip
            return out
        query, key, value, residual = ops["eagle3_layer_qkv"](*inputs, *self.shape, self.norm_before_residual)
        kwargs = {"position_ids": position_ids, "spec_attn_metadata": meta}
        attn = self._attend(query, key, value, attention_mask, cache, kwargs)
        out = ops["decoder_layer_out"](residual, attn, self._weights, *self.shape)
        return out


def install_native_eagle3_layers(model: nn.Module) -> int:
    """Replace the first layer of every ``Eagle3Head`` in ``model`` whose layer is supported
    (``native_layer.supported`` with its ``hidden_norm``) by a ``NativeEagle3Layer``; returns how many."""
    from spec_backend.models.eagle3 import Eagle3Head

    if os.environ.get(NATIVE_LAYERS_ENV, "1") == "0" or native_op("eagle3_layer") is None:
        return 0
    swaps = []
    for name, module in model.named_modules():
        if isinstance(module, Eagle3Head):
            first = module.layers[0]
            if supported(first, extra=("hidden_norm",)):
                prefix = f"{name}." if name else ""
                swaps.append(
                    (f"{prefix}layers.0", NativeEagle3Layer(first, module.spec.norm_before_residual))
                )
    return replace_modules(model, swaps)


__all__ = ["NativeEagle3Layer", "install_native_eagle3_layers"]
