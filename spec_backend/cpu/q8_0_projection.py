"""The output (vocabulary) projection from GGUF Q8_0 blocks, run packed by a small native kernel of ours.

A GGUF file usually stores the token embedding (which tied models reuse as the LM head) as Q8_0;
transformers de-quantizes it to float32, so a decode step read 113 MB for SmolLM2's 49152×576 head
instead of the file's 30 MB. Torch has no kernel for 32-weight int8 blocks (its int8 weight-only kernel
takes one scale per row), so ``csrc/q8_0_gemm.cpp`` is one.

Glossary:

* **Q8_0 block** — 32 consecutive weights of one output row stored as int8 codes ``q`` in [-127, 127]
  and an fp16 scale ``d``: ``w = d·q``. llama.cpp's quantizer takes ``d = max|w| / 127``, so the
  largest weight of a block has code ±127.
* **recovery** — from the de-quantized float32 weight, each block's ``d`` is its ``max|w| / 127``
  (exact: ``127·d`` needs at most 18 significant bits, so float32 holds it and the division undoes it)
  and its codes ``w / d``; then checked: every code an integer in [-127, 127], ``d`` an fp16 value, and
  ``d·q`` equal to the weight. Any other head (a float model, another GGUF type) fails the check and
  keeps the float32 projection — nothing is approximated.
* **kernel** — ``q8_0_mm(x [M, K] float32, codes [N, K] int8, scale [N, K/32]
  float32) -> [M, N]``: each block is de-quantized once in float32 (``d·q`` is exact there) and dotted
  with up to 8 rows, accumulating in float32 in a fixed order. So the logits equal the float32 model's
  up to summation order (**not lossy**), and every row is computed by the same instructions whatever the
  number of rows, so a row's logits do not depend on the batch (speculative verification and plain
  decoding see the same numbers).
* **build** — ``cpu/native.py`` compiles it on first use; when it cannot be built the head stays
  float32 and the reason is logged as a warning. ``SPEC_BACKEND_NATIVE=0`` skips it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from spec_backend.cpu.int4_linear import PackedLinear
from spec_backend.cpu.native import native_kernel_error, required_op
from spec_backend.cpu.vocab_projection import output_embedding

logger = logging.getLogger("spec_backend.backends")

GROUP = 32  # weights per Q8_0 block


def recover_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(codes [N, K] int8, scale [N, K/32] float32)`` when every block of the float32 ``weight [N, K]``
    is an exact Q8_0 block (module glossary), else ``None``."""
    if weight.dim() != 2 or weight.shape[1] % GROUP or weight.dtype != torch.float32 or weight.numel() == 0:
        return None
    n, k = weight.shape
    blocks = weight.detach().reshape(n, k // GROUP, GROUP)  # [N, G, 32]
    if not torch.isfinite(blocks).all():
        return None
    scale = blocks.abs().amax(dim=-1) / 127  # [N, G]
    if not torch.equal(scale.to(torch.float16).to(torch.float32), scale):
        return None
    codes = blocks / torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]  # [N, G, 32]
    if not torch.equal(codes, torch.round(codes)) or float(codes.abs().max()) > 127:
        return None
    if not torch.equal(codes * scale[..., None], blocks):
        return None
    return codes.reshape(n, k).to(torch.int8), scale.contiguous()


def q8_0_mm(rows: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``rows [M, K] float32 @ (scale·codes).T -> [M, N]`` with the native kernel of the ISA variant selected
    now (a ``RuntimeError`` says why where none is loaded)."""
    return required_op("q8_0_mm")(rows, codes, scale)


class Q80Projection(PackedLinear):
    """Drop-in replacement for an ``nn.Linear`` output embedding made of Q8_0 blocks: ``weight`` stays the
    same float32 Parameter (tied embeddings stay tied; drafters read it), the product reads the codes
    with float32 rows."""

    def __init__(self, linear: nn.Linear, codes: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__(linear)
        self.weight = linear.weight  # [V, H]
        self.activation_dtype = torch.float32
        self.codes: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("codes", codes)  # [V, H] int8
        self.register_buffer("scale", scale)  # [V, H/32] float32
        self._op = required_op("q8_0_mm")  # the ISA variant selected now

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:  # [M, H] float32 -> [M, V]
        return self._op(rows, self.codes, self.scale)


def install_q8_0_projection(model: Any) -> bool:
    """Swap ``model``'s CPU ``nn.Linear`` output embedding for a ``Q80Projection`` when its weight is made
    of exact Q8_0 blocks and the kernel loads (a warning names the reason when it does not)."""
    head = output_embedding(model)
    if type(head) is not nn.Linear or head.weight.device.type != "cpu":
        return False
    found = recover_q8_0(head.weight)
    if found is None:
        return False
    error = native_kernel_error()
    if error is not None:
        logger.warning("spec_backend: the Q8_0 LM head stays float32 (native kernel unavailable: %s)", error)
        return False
    model.set_output_embeddings(Q80Projection(head, *found))
    return True


def linear_reference(rows: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The kernel's product in float64 through ``F.linear`` (tests and benchmarks): ``[M, K] -> [M, N]``."""
    n, k = codes.shape
    weight = codes.double().reshape(n, k // GROUP, GROUP) * scale.double()[..., None]  # [N, G, 32]
    return F.linear(rows.double(), weight.reshape(n, k))


__all__ = [
    "GROUP",
    "Q80Projection",
    "install_q8_0_projection",
    "linear_reference",
    "q8_0_mm",
    "recover_q8_0",
]
