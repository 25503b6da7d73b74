"""The draft chain of a head whose draft steps run different layers (``ChainHead.step_kinds`` > 1: MTP with
several layers, draft step ``s`` on layer ``s % n``), fed so that each layer attends over rows it computed
itself, from this request's own inputs.

Every layer keeps its own KV rows in the head's cache. Fed as a one-layer head is (the committed rows
through layer 0 only, one row per draft step), layer ``j >= 1`` attended over positions it had never
written: zeros, rows of an earlier chain's rejected drafts, or rows of the request that held the slot
before. A request's drafts then depended on what ran in its slot earlier (and a seeded sampled request's
tokens with them, whose draws follow its drafts). Now:

* the committed rows go through every layer (the same tokens and target features; each layer writes its
  own rows at the same positions: ``feed_other_layers``);
* draft step ``s`` feeds its layer every chain row that layer has not computed yet (``LayeredChain``):
  chain row ``t`` pairs draft ``t + 1`` with the head output that drew it, at position ``base + t``;

so a layer's row at each position is that layer applied to the position's inputs, as a recompute of the
layer over the committed tokens and the drafts so far gives (the oracle of ``tests/unit/
test_drafter_mtp.py``). Cost: the committed rows ``n`` times, and up to ``n`` rows per draft step.

Glossary: *base* — a request's cache rows before the chain (its committed rows, or one uncounted dummy row
when nothing was committed); *chain row* — a row fed while drafting (dropped at the next step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from spec_backend.runtime.kv_cache import RaggedKVCache

#: one head forward at ``step`` (its layer ``step % n``) over the rows given: ``(tokens [B, Q], hidden
#: [B, Q, H], rows per request, step) -> [B, Q, H]``, written after each request's cached rows
Forward = Callable[[torch.Tensor, torch.Tensor, list[int], int], torch.Tensor]


def feed_other_layers(
    cache: RaggedKVCache,
    start: int,
    before: Sequence[int],  # [B] each request's cache rows before the committed feed
    layers: int,
    forward: Callable[[int], torch.Tensor],  # step -> [B, Q, H]: the committed rows at that layer
) -> None:
    """After layer 0's forward over the committed rows: layers ``1 .. layers - 1`` over the same rows, each
    written at the same positions (the lengths end where layer 0's forward left them)."""
    after = list(cache.lengths[start : start + len(before)])
    for layer in range(1, layers):
        for b, rows in enumerate(before):
            cache.truncate(start + b, rows)
        forward(layer)
    if list(cache.lengths[start : start + len(before)]) != after:
        raise RuntimeError(f"the MTP layers' committed feeds ended at different lengths: {after}")


class LayeredChain:
    """One step's draft chain over a head with ``layers`` step kinds (module docstring)."""

    def __init__(self, cache: RaggedKVCache, start: int, batch: int, layers: int, forward: Forward) -> None:
        self.cache, self.start, self.layers, self.forward = cache, start, layers, forward
        self.base = list(cache.lengths[start : start + batch])  # [B] rows before the chain
        self.ids: list[torch.Tensor] = []  # chain row t: draft t + 1, [B]
        self.outs: list[torch.Tensor] = []  # chain row t: the head output that drew it, [B, H]
        self.written = [0] * layers  # chain rows each layer has computed

    def step(self, step: int, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # -> [B, H]
        """Draft step ``step`` (>= 1): ``ids`` ``[B]`` is draft ``step``, drawn from ``out`` ``[B, H]``; the
        head output after it, from layer ``step % layers`` over the chain rows it lacks."""
        if step != len(self.ids) + 1:
            raise ValueError(f"draft step {step} after {len(self.ids)} chain row(s)")
        self.ids.append(ids)
        self.outs.append(out)
        layer = step % self.layers
        first = self.written[layer]
        for b, rows in enumerate(self.base):  # drop the rows other layers' steps added after its own
            self.cache.truncate(self.start + b, rows + first)
        tokens = torch.stack(self.ids[first:], dim=1)  # [B, step - first]
        hidden = torch.stack(self.outs[first:], dim=1)  # [B, step - first, H]
        fed = self.forward(tokens, hidden, [step - first] * len(self.base), step)  # [B, step - first, H]
        self.written[layer] = step
        return fed[:, -1]


__all__ = ["LayeredChain", "feed_other_layers"]
