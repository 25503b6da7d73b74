"""Few-row float32 products (the vocabulary projection, and the decoder's projections while a step verifies
a few positions) as tall-skinny BLAS calls, where this machine runs them faster.

During decoding a projection multiplies a few hidden rows ``x [M, H]`` by a weight ``W [N, H]``; for the
vocabulary projection N is very tall (≈ 50k–150k). Some CPU BLAS builds pick a poor kernel for ``x @ W.T``
at small M: on the 2-core AMD EPYC reference machine, with SmolLM2's 49152×576 projection, ``F.linear``
took 10 ms at M=1, 23–34 ms at M=2–3 and 18 ms at M=5, while the same product computed as ``(W @ x.T).T``
took 4.2 ms (M=2) and 5.7 ms (M=5) — the weight bytes are read once either way, the kernel choice differs.
Others do not: on an Intel Xeon VM the tall-skinny product is the slower one at 1–3 rows. So the row counts
that take it are measured per machine when a model loads (``few_rows``: the rows set, the rule, the
``SPEC_BACKEND_FEW_ROWS`` override); where none does, the layer stays an ``nn.Linear``.

Results equal ``F.linear`` up to floating-point summation order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from spec_backend.cpu.few_rows import DECODER_ROWS, HEAD_ROWS, rows_set, tall_skinny


def output_embedding(model: Any) -> Any:
    """``model.get_output_embeddings()``, or ``None`` for a model without that method."""
    get_out = getattr(model, "get_output_embeddings", None)
    return get_out() if callable(get_out) else None


class TallSkinnyProjection(nn.Module):
    """Drop-in replacement for an ``nn.Linear`` that runs the tall-skinny product at the row counts in
    ``rows`` (``few_rows``) and ``F.linear`` at every other; shares the linear's parameters."""

    def __init__(self, linear: nn.Linear, rows: frozenset[int]) -> None:
        super().__init__()
        self.weight = linear.weight  # [N, H], the same Parameter: tied embeddings stay tied
        self.bias = linear.bias
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.rows = rows

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., N]
        rows = hidden.reshape(-1, self.in_features)  # [M, H]
        if rows.shape[0] not in self.rows:
            return F.linear(hidden, self.weight, self.bias)
        out = tall_skinny(rows, self.weight)  # [M, N]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*hidden.shape[:-1], self.out_features)


def install_small_batch_linears(model: nn.Module) -> int:
    """Swap every ``nn.Linear`` inside ``model``'s decoder (not the output embedding, which
    ``install_tall_skinny_projection`` handles) for ``TallSkinnyProjection`` with the rows set measured for
    them (``few_rows.DECODER_ROWS``); returns how many were swapped (none where the set is empty).
    Parameters are shared, so weights and ties are unchanged."""
    head = output_embedding(model)
    swapped = [
        (name, module)
        for name, module in model.named_modules()
        if type(module) is nn.Linear and module is not head  # subclasses (quantized ones) are left as is
    ]
    floats = [m for _, m in swapped if m.weight.dtype == torch.float32]
    rows = rows_set([m.weight for m in floats], DECODER_ROWS).rows
    if not rows:
        return 0
    return replace_modules(
        model, [(name, TallSkinnyProjection(module, rows)) for name, module in swapped if module in floats]
    )


def replace_modules(model: nn.Module, swaps: Sequence[tuple[str, nn.Module]]) -> int:
    """Put each ``(name, replacement)`` into ``model`` at ``name``; returns how many."""
    for name, replacement in swaps:
        model.set_submodule(name, replacement)
    return len(swaps)


def install_tall_skinny_projection(model: Any) -> bool:
    """Swap ``model``'s float32 ``nn.Linear`` output embedding for ``TallSkinnyProjection`` with the rows
    set measured for it (``few_rows.HEAD_ROWS``); False if it has none, or the set is empty."""
    head = output_embedding(model)
    if not isinstance(head, nn.Linear) or head.weight.dtype != torch.float32:
        return False
    rows = rows_set([head.weight], HEAD_ROWS).rows
    if not rows:
        return False
    model.set_output_embeddings(TallSkinnyProjection(head, rows))
    return True
