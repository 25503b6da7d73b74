"""The output (vocabulary) projection as a tall-skinny product, for CPU BLAS.

During decoding the projection multiplies a few hidden rows ``x [M, H]`` by a very tall weight
``W [V, H]`` (V ≈ 50k–150k). CPU BLAS libraries pick a poor kernel for ``x @ W.T`` at small M: on the
2-core reference machine, with SmolLM2's 49152×576 projection, ``F.linear`` takes 10 ms at M=1,
23–34 ms at M=2–3 and 18 ms at M=5, while the same product computed as ``(W @ x.T).T`` takes
4.2 ms (M=2), 5.7 ms (M=5) — the weight bytes are read once either way, the kernel choice differs.
A single row is duplicated to M=2, which beats the matrix-vector kernel. Above ``max_rows`` rows
(prefill of many positions) ``F.linear`` is used unchanged.

The decoder's own linear layers (attention and MLP projections) suffer the same way whenever a step
verifies K+1 positions. Measured on the same machine over all 210 linear layers of SmolLM2's decoder
(medians of 7, ``benchmarks/bench_small_batch_linear.py``): at M=1/2/3/4 rows ``F.linear`` takes
37/61/63/50 ms, the tall-skinny product 30/17/26/33 ms; at M=5 and from M=8 on ``F.linear`` is as fast
or faster (0.72-1.08x).
So ``install_small_batch_linears`` swaps them with ``max_rows=4``, and an odd row count is padded with a
copy of its last row (M=3 computes as 4), which is the faster kernel at every M measured.

Results equal ``F.linear`` up to floating-point summation order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def output_embedding(model: Any) -> Any:
    """``model.get_output_embeddings()``, or ``None`` for a model without that method."""
    get_out = getattr(model, "get_output_embeddings", None)
    return get_out() if callable(get_out) else None


class TallSkinnyProjection(nn.Module):
    """Drop-in replacement for the model's ``nn.Linear`` output embedding; shares its parameters."""

    def __init__(self, linear: nn.Linear, max_rows: int = 64) -> None:
        super().__init__()
        self.weight = linear.weight  # [V, H], the same Parameter: tied embeddings stay tied
        self.bias = linear.bias
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.max_rows = max_rows

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V]
        rows = hidden.reshape(-1, self.in_features)  # [M, H]
        m = rows.shape[0]
        if m == 0 or m > self.max_rows:
            return F.linear(hidden, self.weight, self.bias)
        if m % 2 == 1:  # a real copy: a stride-0 expand falls back to the slow kernel again
            rows = torch.cat([rows, rows[-1:]])  # [M + 1, H]: even row counts take the fast kernel
        out = torch.matmul(self.weight, rows.T).T[:m]  # [M, V]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*hidden.shape[:-1], self.out_features)


def install_small_batch_linears(model: nn.Module, max_rows: int = 4) -> int:
    """Swap every ``nn.Linear`` inside ``model``'s decoder (not the output embedding, which
    ``install_tall_skinny_projection`` handles) for ``TallSkinnyProjection`` with ``max_rows`` rows;
    returns how many were swapped. Parameters are shared, so weights and ties are unchanged."""
    head = output_embedding(model)
    swapped = [
        (name, module)
        for name, module in model.named_modules()
        if type(module) is nn.Linear and module is not head  # subclasses (quantized ones) are left as is
    ]
    return replace_modules(
        model, [(name, TallSkinnyProjection(module, max_rows)) for name, module in swapped]
    )


def replace_modules(model: nn.Module, swaps: Sequence[tuple[str, nn.Module]]) -> int:
    """Put each ``(name, replacement)`` into ``model`` at ``name``; returns how many."""
    for name, replacement in swaps:
        model.set_submodule(name, replacement)
    return len(swaps)


def install_tall_skinny_projection(model: Any, max_rows: int = 64) -> bool:
    """Swap ``model``'s ``nn.Linear`` output embedding for ``TallSkinnyProjection``; False if it has none."""
    head = output_embedding(model)
    if not isinstance(head, nn.Linear):
        return False
    model.set_output_embeddings(TallSkinnyProjection(head, max_rows))
    return True
