"""A head's weights as the int4 drafter will serve them, for scoring and quantization-aware training.

``speculative_config["quantization"] = "int4"`` turns each linear layer of a head into Q4_1-style blocks
(``spec_backend.cpu.int4_linear.quantize_int4``: 16 levels from each 32-weight block's minimum to its
maximum). Some heads lose much of their acceptance to that rounding (docs/research/eagle3-smollm2.md,
sixth round: a head trained on a GPU drafts 0.26 less per step on held-out prompts, one trained on the
CPU 0.00).

Glossary:
    round trip: a weight quantized by ``quantize_int4`` and de-quantized again (codes · scale + minimum):
        the values the int4 drafter computes with (its activations are rounded too, not modelled here).
    quantization-aware training (QAT): each step's forward and backward run with the round-trip weights
        and the optimiser updates the float weights with those gradients (the straight-through
        estimator), so the head learns weights whose round trip drafts well.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def int4_round_trip(weight: torch.Tensor) -> torch.Tensor:  # [N, K] -> [N, K]
    """``weight`` as the int4 drafter holds it (glossary); ``K`` must be a multiple of 32."""
    from spec_backend.cpu.int4_linear import GROUP, quantize_int4

    found = quantize_int4(weight.detach().float())
    if found is None:
        raise ValueError(
            f"int4 blocks need a 2-D weight whose columns are a multiple of {GROUP}, got {list(weight.shape)}"
        )
    codes, scale, low = found  # [N, K], [N, K/32], [N, K/32]
    n, k = weight.shape
    blocks = codes.float().reshape(n, k // GROUP, GROUP) * scale[..., None] + low[..., None]  # [N, K/32, 32]
    return blocks.reshape(n, k).to(weight.dtype)


def int4_linears(module: nn.Module) -> list[nn.Linear]:
    """The linear layers ``quantize_int4`` serves as int4: every ``nn.Linear`` whose input size is a
    multiple of 32, but an output embedding (which ``install_int4_linears`` keeps in float32)."""
    from spec_backend.cpu.int4_linear import GROUP
    from spec_backend.cpu.vocab_projection import output_embedding

    keep = output_embedding(module)
    return [
        m for m in module.modules() if type(m) is nn.Linear and m is not keep and m.in_features % GROUP == 0
    ]


@contextmanager
def int4_weights(layers: list[nn.Linear]) -> Iterator[None]:
    """Within the block, ``layers`` compute with their weights' round trips; on leaving, the float weights
    come back exactly (gradients taken inside stay: what QAT's optimiser step applies to them)."""
    saved = [layer.weight.detach().clone() for layer in layers]
    try:
        with torch.no_grad():
            for layer in layers:
                layer.weight.copy_(int4_round_trip(layer.weight))
        yield
    finally:
        with torch.no_grad():
            for layer, weight in zip(layers, saved, strict=True):
                layer.weight.copy_(weight)


__all__ = ["int4_linears", "int4_round_trip", "int4_weights"]
