"""DFlash2 (z-lab's ``DFlash2DraftModel``): a DFlash head with two additions, read from the same
checkpoint folder.

Format: ``dflash_config`` adds ``conv_kernel_size``, ``conv_group_size``, ``selector_rank`` and
``selector_top_k`` (and usually ``output_multiplier``, ``final_logit_softcapping``); the weights add,
per layer, ``layers.{i}.{attention,mlp}_conv.base_kernel [2, ks, H]`` and
``layers.{i}.{attention,mlp}_conv.kernel_projection.weight [2·ks·G, H]`` (G = H / group size), and
``candidate_selector.{predecessor,successor}_codebook [V, r]`` (stored without ``.weight``) and
``candidate_selector.hidden_projection.weight [r, H]``.

Glossary:

* **grouped dynamic causal convolution** — around the attention and around the MLP of every layer, along
  the block's rows: ``prepare`` mixes each row with the ``ks - 1`` rows before it (zeros before the
  block) with a static per-channel kernel plus a per-row, per-group kernel projected from the row
  itself; ``finish`` does the same to the sub-layer's output with the second halves of both kernels.
* **candidate selector** — each draft position keeps its ``selector_top_k`` most likely tokens
  (*candidates*, scored by their logits, the *unary* score); drafts are chosen left to right, each
  candidate's score adding ``<predecessor_codebook[previous token] ⊙ hidden_projection(row),
  successor_codebook[candidate]>``; the previous token of the first draft is the block's anchor (the
  last committed token). Greedy requests take the best candidate; sampled ones draw from the softmax of
  the scores under their temperature, which is the draft distribution the sampler receives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class DFlash2Spec:
    """The DFlash2 fields of ``dflash_config``."""

    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int


def parse_dflash2(path: str, dflash: dict[str, Any], hidden: int, vocab: int) -> DFlash2Spec | None:
    """The DFlash2 fields, ``None`` for a plain DFlash config; ``ValueError`` naming a bad one."""
    names = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
    present = [n for n in names if n in dflash]
    if not present:
        return None
    values = {n: dflash.get(n) for n in names}
    bad = [f"{n}={v!r}" for n, v in values.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad or hidden % int(values["conv_group_size"] or 1) or int(values["selector_top_k"] or 1) > vocab:
        raise ValueError(
            f"DFlash2 checkpoint {path!r}: dflash_config needs {', '.join(names)} as ints >= 1, the group "
            f"size dividing hidden_size {hidden} and selector_top_k <= the vocabulary {vocab}; got {values}"
        )
    return DFlash2Spec(*(int(values[n]) for n in names))  # type: ignore[arg-type]


class GroupedDynamicConv(torch.nn.Module):
    """The convolution around one sub-layer (module docstring)."""

    def __init__(self, hidden: int, kernel_size: int, group_size: int) -> None:
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        groups = hidden // group_size
        self.base_kernel = torch.nn.Parameter(torch.zeros(2, kernel_size, hidden))
        self.kernel_projection = torch.nn.Linear(hidden, 2 * kernel_size * groups, bias=False)

    def _convolve(self, x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        b, q, h = x.shape  # x [B, Q, H]; dynamic [B, Q, ks, G]; base [ks, H]
        groups = h // self.group_size
        blocks = x.view(b, q, groups, self.group_size)  # [B, Q, G, g]
        out = torch.zeros_like(blocks)
        for offset in range(self.kernel_size):
            shifted = torch.zeros_like(blocks)
            shifted[:, offset:] = blocks[:, : q - offset]  # row t reads row t - offset (zeros before)
            kernel = base[offset].view(1, 1, groups, self.group_size).to(x.dtype)
            out = out + kernel * shifted + dynamic[:, :, offset, :, None] * shifted
        return out.view(b, q, h)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [B, Q, H]
        """The sub-layer's input, convolved, and the dynamic kernel ``[B, Q, ks, G]`` for ``finish``."""
        groups = x.shape[-1] // self.group_size
        dynamic = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, groups)
        return self._convolve(x, dynamic[..., 0, :, :], self.base_kernel[0]), dynamic[..., 1, :, :]

    def finish(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:  # [B, Q, H]
        return self._convolve(x, dynamic, self.base_kernel[1])


class CandidateSelector(torch.nn.Module):
    """Left-to-right choice among each position's top candidates (module docstring)."""

    def __init__(self, vocab: int, hidden: int, spec: DFlash2Spec) -> None:
        super().__init__()
        self.top_k = spec.selector_top_k
        self.predecessor_codebook = torch.nn.Parameter(torch.zeros(vocab, spec.selector_rank))
        self.successor_codebook = torch.nn.Parameter(torch.zeros(vocab, spec.selector_rank))
        self.hidden_projection = torch.nn.Linear(hidden, spec.selector_rank, bias=False)

    def candidates(
        self, hidden: torch.Tensor, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per draft row: unary scores ``[B, K, k]``, candidate ids ``[B, K, k]``, the row's projection
        ``[B, K, r]``."""
        unary, ids = torch.topk(logits, self.top_k, dim=-1)  # [B, K, k]
        return unary, ids, self.hidden_projection(hidden)

    def scores(
        self,
        unary: torch.Tensor,  # [B, k] this position's
        ids: torch.Tensor,  # [B, k]
        projected: torch.Tensor,  # [B, r]
        previous: torch.Tensor,  # [B] the token before this position
        vocab: int,
    ) -> torch.Tensor:  # [B, V] the candidates' scores, -inf elsewhere
        pair = torch.einsum(
            "br,bkr->bk",
            self.predecessor_codebook[previous] * projected,
            self.successor_codebook[ids].to(projected.dtype),
        )  # [B, k]
        full = unary.new_full((unary.shape[0], vocab), -math.inf)
        return full.scatter(1, ids, (unary + pair).to(full.dtype))


def add_dflash2_modules(head: Any, spec: DFlash2Spec, vocab: int) -> None:
    """Give each layer of ``head`` its two convolutions and the head its candidate selector."""
    hidden = int(head.config.hidden_size)
    for layer in head.layers:
        layer.attention_conv = GroupedDynamicConv(hidden, spec.conv_kernel_size, spec.conv_group_size)
        layer.mlp_conv = GroupedDynamicConv(hidden, spec.conv_kernel_size, spec.conv_group_size)
    head.candidate_selector = CandidateSelector(vocab, hidden, spec)


__all__ = ["CandidateSelector", "DFlash2Spec", "GroupedDynamicConv", "add_dflash2_modules", "parse_dflash2"]
