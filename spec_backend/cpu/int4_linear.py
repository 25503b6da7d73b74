"""GGUF Q4_1 linear layers kept as 4-bit codes on CPU, run with torch's int4 weight-only kernel.

Glossary:

* **Q4_1 block** — 32 consecutive input weights of one output row stored as 4-bit codes ``q`` with an
  fp16 scale ``d`` and minimum ``m``: ``w = d·q + m``. llama.cpp's quantizer sets ``m`` to the block's
  minimum and ``d = (max − min) / 15``, so the smallest weight has code 0 and the largest code 15.
* **recovery** — transformers loads a GGUF model de-quantized to float32. From those floats each block's
  ``m`` (its minimum), ``d`` (its range / 15, rounded to fp16 as stored) and codes are recovered, then
  checked: every weight must be re-created to within float32 rounding. A layer that is not made of Q4_1
  blocks (any float model, any other GGUF type) fails the check and is left untouched — so only
  weights that really are Q4_1 are packed, and never approximated.
* **int4 pack** — torch's CPU kernel ``_weight_int4pack_mm_for_cpu`` computes, per group of 32 inputs,
  ``w = (q − 8)·scale + zero``; with ``scale = d`` and ``zero = m + 8d`` that is the Q4_1 weight. A step
  then reads 4.5 bits per weight instead of 32. The kernel is fast only with bfloat16 activations (its
  float32 path is ~15× slower than float32 BLAS on the reference machine), so activations, ``scale``
  and ``zero`` are rounded to bfloat16 (relative 2⁻⁹) and the output is returned as float32: this is
  **lossy** against the de-quantized float32 model, as llama.cpp's own int8 activation rounding is.

* **native kernel** — where the native kernels build (``cpu/native.py``, one build per ISA variant:
  ``cpu/isa.py``), ``csrc/q4_1_mm.cpp`` replaces torch's: each row's activations are quantized per 32
  values to int8 codes with a float32 scale (``amax / 127``, as llama.cpp's Q8_1), each block's dot
  product with the 4-bit codes is an exact integer (``vpdpbusd`` on AVX512-VNNI and AVX-VNNI,
  ``vpmaddubsw`` + ``vpmaddwd`` on AVX2, plain C++ in the generic variant), then
  ``d·dot·scale_x + m·scale_x·Σcodes_x`` accumulates in float32 by two FMAs per block in a fixed order —
  the same bits on every variant. **Lossy** like the bfloat16 path (an activation moves by at most half
  its block's step, ``amax / 254``), 3–4× faster on the reference machine, and a row's result does not
  depend on the batch. Which of the three paths (native, bfloat16, the float32 weights) a model runs is
  measured when it loads (``fast_path``).
* **tile layout** — 16 output rows per tile; for each tile and block, 256 bytes where 32-bit lane ``j``
  of 64-byte part ``c`` holds codes ``4c .. 4c+3`` of row ``j`` (low nibbles) and ``16+4c .. 16+4c+3``
  (high nibbles) — what one ``vpdpbusd`` lane multiplies; scales and minima ``[N/16, K/32, 16]``, in
  float16 where every one of them is a float16 value (a Q4_1 file's are; a Q4_K or Q4_0 block's products
  of two scales need not be) and the ISA variant converts them by an instruction, else float32: 20 bytes
  per 32 weights instead of 24, and the same bits, the conversion being exact (``tile_scales``).

Numerics: ``tests/unit/test_int4_linear.py`` bounds one layer's error against the de-quantized float32
layer; the logit difference and greedy agreement on the bundled model are in ``docs/benchmarks.md``.
Speculative decoding stays lossless with respect to the prepared model: every forward of the target,
plain or speculative, runs the same kernels.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from spec_backend.cpu.gguf_blocks import Decoded
from spec_backend.cpu.native import active_variant, native_op
from spec_backend.cpu.vocab_projection import output_embedding, replace_modules

GROUP = 32  # Q4_1 block size, and the kernel's group size
LANES = 16  # output rows per tile of the native kernel
#: ``Int4Linear``'s kernels: ours (the selected ISA variant's) and torch's bfloat16 one
KERNELS = ("native", "torch")


def _levels(
    weight: torch.Tensor, stored_scale: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` in blocks of 32 with 16 levels from each block's minimum to maximum: the blocks
    ``[N, G, 32]``, minima and scales ``[N, G]`` (rounded to fp16 as Q4_1 stores them with
    ``stored_scale``), and each weight's nearest level ``[N, G, 32]`` (unclamped)."""
    n, k = weight.shape
    blocks = weight.detach().float().reshape(n, k // GROUP, GROUP)  # [N, G, 32]
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)  # [N, G]
    scale = (high - low) / 15
    if stored_scale:
        scale = scale.to(torch.float16).to(torch.float32)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return blocks, low, scale, torch.round((blocks - low[..., None]) / safe[..., None])


def recover_q4_1(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(codes [N, K] int32, scale [N, K/32], minimum [N, K/32])`` when every block of ``weight
    [N, K]`` is an exact Q4_1 block (module glossary), else ``None``."""
    if weight.dim() != 2 or weight.shape[1] % GROUP or weight.dtype != torch.float32 or weight.numel() == 0:
        return None
    if not torch.isfinite(weight).all():
        return None
    blocks, low, scale, codes = _levels(weight, stored_scale=True)
    if codes.min() < 0 or codes.max() > 15:
        return None
    rebuilt = codes * scale[..., None] + low[..., None]  # [N, G, 32]
    tolerance = 4 * torch.finfo(torch.float32).eps * blocks.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    if ((rebuilt - blocks).abs() > tolerance).any():
        return None
    return codes.reshape(weight.shape).to(torch.int32), scale, low


class PackedLinear(nn.Module):
    """A linear layer whose weight-only kernel takes rows of ``activation_dtype`` (bfloat16 for torch's
    kernels): ``forward`` turns ``[..., K]`` into rows, calls ``matmul`` and returns the input's dtype
    with the layer's bias."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias
        self.activation_dtype = torch.bfloat16

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:  # [M, K] bfloat16 -> [M, N]
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        rows = x.reshape(-1, self.in_features).to(self.activation_dtype).contiguous()  # [M, K]
        out = self.matmul(rows).to(x.dtype)  # [M, N]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


class Int4Linear(PackedLinear):
    """A Q4_1 ``nn.Linear`` replaced by its packed codes (module glossary); float32 in and out. ``kernel``
    is ``"native"`` (ours, of the ISA variant selected now: ``isa``) where it is available and the layer
    has a multiple of 16 outputs, else ``"torch"``; ``kernel="torch"`` asks for torch's."""

    def __init__(
        self,
        linear: nn.Linear,
        codes: torch.Tensor,
        scale: torch.Tensor,
        low: torch.Tensor,
        kernel: str | None = None,
    ) -> None:
        super().__init__(linear)
        n = codes.shape[0]
        if kernel not in (None, *KERNELS):
            raise ValueError(f"kernel must be None, 'native' or 'torch', got {kernel!r}")
        op = native_op("q4_1_q8_mm") if n % LANES == 0 and kernel != "torch" else None
        if kernel == "native" and op is None:
            raise ValueError(f"kernel='native' needs the native kernels and N % 16 == 0 (N={n})")
        self._op = op
        variant = active_variant() if op is not None else None
        self.isa = variant.name if variant is not None else ""  # the native kernel's ISA variant
        if op is not None:
            self.kernel, self.activation_dtype = "native", torch.float32
            self.register_buffer("tiles", q4_1_tiles(codes))  # [N/16, G, 256] uint8
            tile_scale, tile_low = tile_scales(scale, low, half=variant is not None and variant.half_scales)
            self.register_buffer("tile_scale", tile_scale)  # [N/16, G, 16]
            self.register_buffer("tile_low", tile_low)
            return
        self.kernel = "torch"
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)  # [N, K/2] uint8
        self.register_buffer("packed", packed)
        zero = low + 8 * scale  # [N, G]
        pairs = torch.stack([scale.T, zero.T], dim=-1).to(torch.bfloat16).contiguous()  # [G, N, 2]
        self.register_buffer("scales_and_zeros", pairs)

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        if self._op is not None:  # the native kernel
            return self._op(rows, self.tiles, self.tile_scale, self.tile_low)
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows, self.packed, GROUP, self.scales_and_zeros
        )
        return out


def tile_scales(scale: torch.Tensor, low: torch.Tensor, half: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and minima ``[N, G]`` in the tile layout ``[N/16, G, 16]``: float16 where ``half`` (the
    kernel's ISA variant converts them by an instruction: ``Variant.half_scales``) and every value of both
    is a float16 value (the conversion is exact, so the output is the same), else float32 (module
    glossary)."""
    n, groups = scale.shape
    by_tile = (n // LANES, LANES, groups)
    tiled = [t.to(torch.float32).reshape(by_tile).transpose(1, 2).contiguous() for t in (scale, low)]
    if half and all(torch.equal(t.to(torch.float16).to(torch.float32), t) for t in tiled):
        return tiled[0].to(torch.float16), tiled[1].to(torch.float16)
    return tiled[0], tiled[1]


def q4_1_tiles(codes: torch.Tensor) -> torch.Tensor:
    """Codes ``[N, K]`` (0..15, N a multiple of 16) in the native kernel's tile layout ``[N/16, K/32, 256]``
    (module glossary)."""
    n, k = codes.shape
    parts = codes.reshape(n // LANES, LANES, k // GROUP, 8, 4).permute(0, 2, 3, 1, 4)  # [T, G, 8, 16, 4]
    return (parts[:, :, :4] | (parts[:, :, 4:] << 4)).to(torch.uint8).reshape(n // LANES, k // GROUP, 256)


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Any float weight ``[N, K]`` (K a multiple of 32) as Q4_1-style blocks (lossy: each block's 16
    levels span its minimum to maximum), in ``recover_q4_1``'s layout; ``None`` when K does not fit."""
    if weight.dim() != 2 or weight.shape[1] % GROUP or weight.numel() == 0:
        return None
    _, low, scale, codes = _levels(weight, stored_scale=False)
    return torch.clamp(codes, 0, 15).reshape(weight.shape).to(torch.int32), scale, low


def q4_blocks(decoded: Decoded | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A GGUF Q4_K or Q4_0 tensor as ``recover_q4_1``'s ``(codes [N, K] int32, scale [N, K/32], minimum
    [N, K/32])``: a Q4_K sub-block is ``w = (d·sc)·q − dmin·m`` and a Q4_0 block ``w = d·q − 8d`` (codes
    0..15), each a Q4_1 block with a float32 scale and minimum."""
    if decoded is None or decoded.kind not in ("Q4_K", "Q4_0"):
        return None
    if decoded.kind == "Q4_0":  # decoded as q - 8
        return (decoded.codes + 8).to(torch.int32), decoded.scale, -8 * decoded.scale
    return decoded.codes.to(torch.int32), decoded.scale, decoded.low


def install_int4_linears(
    model: Any, quantize: bool = False, kernel: str | None = None, blocks: dict[int, Decoded] | None = None
) -> int:
    """Replace every CPU ``nn.Linear`` of ``model`` but the output embedding (drafters and the engine read
    its weight; it stays float32) whose float32 weight is made of exact Q4_1 blocks, or whose GGUF tensor
    is Q4_K or Q4_0 (``blocks``: ``kquant_linear.read_blocks``), by an ``Int4Linear`` with ``kernel`` (and,
    with ``quantize``, every other one whose input size is a multiple of 32, lossily); returns how many were
    replaced. Layers whose output size is not a multiple of 16 stay as they are: neither kernel takes
    them."""
    head = output_embedding(model)
    swaps = []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or module is head or module.weight.device.type != "cpu":
            continue
        if module.out_features % LANES:
            continue
        decoded = (blocks or {}).get(id(module.weight))  # the file's own blocks, when read, decide
        found = q4_blocks(decoded) if decoded is not None else recover_q4_1(module.weight)
        if found is None and quantize:
            found = quantize_int4(module.weight)
        if found is not None:
            swaps.append((name, Int4Linear(module, *found, kernel=kernel)))
    return replace_modules(model, swaps)


__all__ = [
    "GROUP",
    "KERNELS",
    "LANES",
    "Int4Linear",
    "PackedLinear",
    "install_int4_linears",
    "q4_1_tiles",
    "q4_blocks",
    "quantize_int4",
    "recover_q4_1",
]
