"""GGUF block-quantized tensors read from the file as codes, scales and offsets (no float round trip).

transformers loads a GGUF model de-quantized to float32. For Q4_1 and Q8_0 the blocks can be recovered
from those floats (``int4_linear.recover_q4_1``, ``q8_0_projection.recover_q8_0``); for the k-quants they
cannot (a Q6_K sub-block's scale is not determined by its values), so their codes are read from the file.

Glossary:

* **super-block** — the k-quants' unit: 256 consecutive weights of one row (``QK_K``).
* **Q4_K / Q5_K** — a super-block of eight 32-weight sub-blocks; fp16 ``d`` and ``dmin``, per sub-block a
  6-bit scale ``sc`` and minimum ``m`` (packed in 12 bytes), 4-bit codes (Q5_K: plus one high bit each):
  ``w = (d·sc)·q − dmin·m``.
* **Q6_K** — sixteen 16-weight sub-blocks; fp16 ``d``, an int8 scale per sub-block, 6-bit codes stored as
  4 low bits and 2 high bits: ``w = (d·sc)·(q − 32)``.
* **Q8_0** — 32-weight blocks, fp16 ``d`` and int8 codes: ``w = d·q``.
* **Q4_0 / Q5_0 / Q5_1** — 32-weight blocks with fp16 ``d`` (Q5_1: and ``m``), 4-bit codes (Q5_*: plus a
  32-bit word of high bits): ``w = d·(q − 8)``, ``d·(q − 16)``, ``d·q + m``. llama.cpp's k-quant mixes
  store a tensor whose rows are not a multiple of 256 weights in these (SmolLM2's 576-wide ones: Q5_0).
* **decoded tensor** — ``Decoded(codes [N, K] int8, scale [N, K/group], low [N, K/group], group)``:
  ``w = scale·code + low`` per ``group`` consecutive weights (32, or 16 for Q6_K). ``d·sc`` is exact in
  float32 (an fp16 times a small integer), so ``scale·code`` is the de-quantized product exactly.
* **row order** — llama.cpp's converter permutes the rows of a llama-style ``q``/``k`` projection (rotary
  halves interleaved) and transformers undoes it when loading; ``match_rows`` tries the file's order and
  that reversal and keeps the one whose weights equal the loaded module's, or nothing: a tensor is used
  only when it re-creates the weights the model was loaded with (to float32 rounding).

Format facts are from llama.cpp's ``ggml-common.h`` block structs; ``tests/unit/test_gguf_kquants.py``
checks every decoder against the ``gguf`` package's de-quantizers on blocks written in the file format.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

QK_K = 256  # weights per k-quant super-block
#: type name -> (bytes per block, weights per block); the types this module reads
BLOCK_BYTES = {
    "Q4_K": (144, 256),
    "Q5_K": (176, 256),
    "Q6_K": (210, 256),
    "Q8_0": (34, 32),
    "Q4_0": (18, 32),
    "Q5_0": (22, 32),
    "Q5_1": (24, 32),
}


@dataclass(frozen=True)
class Decoded:
    """A decoded tensor (module glossary): ``w = scale·code + low`` per ``group`` weights."""

    kind: str
    codes: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N, K/group] float32
    low: torch.Tensor  # [N, K/group] float32
    group: int

    def weights(self) -> torch.Tensor:  # [N, K] float32
        n, k = self.codes.shape
        by_group = self.codes.reshape(n, k // self.group, self.group).float()  # [N, G, group]
        return (by_group * self.scale[..., None] + self.low[..., None]).reshape(n, k)

    def rows(self, order: torch.Tensor) -> Decoded:
        """The same tensor with its rows in ``order`` (``[N]`` indices)."""
        return Decoded(self.kind, self.codes[order], self.scale[order], self.low[order], self.group)


def _halves(blocks: np.ndarray, *sizes: int) -> list[np.ndarray]:
    return np.hsplit(blocks, list(np.cumsum(sizes)))


def _fp16(raw: np.ndarray) -> np.ndarray:  # [B, 2] uint8 -> [B, 1] float32
    return raw.copy().view(np.float16).astype(np.float32)


def _scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's twelve scale bytes ``[B, 12]`` -> 6-bit scales and minima ``[B, 8]``: bytes 0-3 hold
    scales 0-3 (6 low bits) and the high 2 bits of scales 4-7, bytes 4-7 the same for minima, bytes 8-11
    the low 4 bits of scales 4-7 (low nibble) and of minima 4-7 (high nibble)."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scale = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=1)
    minimum = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return scale.astype(np.float32), minimum.astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``[B, 128]`` bytes -> ``[B, 8, 32]`` codes: chunk i of 32 bytes holds sub-block 2i in its low
    nibbles and sub-block 2i+1 in its high nibbles."""
    chunks = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (chunks & 15).reshape(-1, 8, 32)


def _q4_k(blocks: np.ndarray, high_bits: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if high_bits:  # Q5_K: d, dmin, scales, qh [32], qs [128]
        d, dmin, packed, qh, qs = _halves(blocks, 2, 2, 12, 32)
    else:
        d, dmin, packed, qs = _halves(blocks, 2, 2, 12)
    sc, m = _scale_min(packed)
    codes = _nibbles(qs)  # [B, 8, 32]
    if high_bits:  # bit j of qh[l] is the fifth bit of sub-block j's code l
        bits = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # [B, 8, 32]
        codes = codes | (bits << 4)
    return codes, _fp16(d) * sc, -(_fp16(dmin) * m)


def _q6_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ql, qh, sc, d = _halves(blocks, 128, 64, 16)
    # per half of 128 weights: 64 ql bytes (low nibbles: weights 0-63, high: 64-127) and 32 qh bytes
    # (bit pairs 0, 2, 4, 6: the high bits of weights 0-31, 32-63, 64-95, 96-127)
    low4 = (ql.reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 15
    high2 = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    codes = low4.reshape(-1, 2, 4, 32) | (high2 << 4)  # [B, 2, 4, 32] in 0..63
    scale = _fp16(d) * sc.copy().view(np.int8).astype(np.float32)  # [B, 16]
    return codes.reshape(-1, 16, 16).astype(np.int8) - np.int8(32), scale, np.zeros_like(scale)


def _q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, qs = _halves(blocks, 2)
    scale = _fp16(d)
    return qs.copy().view(np.int8).reshape(-1, 1, 32), scale, np.zeros_like(scale)


def _legacy(blocks: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_0, Q5_0, Q5_1: code j < 16 in the low nibble of byte j, code 16 + j in its high nibble, and for
    Q5_* bit j of the little-endian word ``qh`` the fifth bit of code j."""
    if kind == "Q5_1":
        d, m, qh, qs = _halves(blocks, 2, 2, 4)
    elif kind == "Q5_0":
        d, qh, qs = _halves(blocks, 2, 4)
    else:
        d, qs = _halves(blocks, 2)
    codes = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int16)  # [B, 32]
    if kind != "Q4_0":
        word = qh.copy().view("<u4").astype(np.int64)  # [B, 1]
        codes |= (((word >> np.arange(32)) & 1) << 4).astype(np.int16)
    scale = _fp16(d)
    if kind == "Q5_1":
        return codes[:, None], scale, _fp16(m)
    return codes[:, None] - (8 if kind == "Q4_0" else 16), scale, np.zeros_like(scale)


def decode(kind: str, data: np.ndarray, n: int, k: int) -> Decoded:
    """The GGUF tensor ``data`` (raw blocks, any shape holding ``n·k`` weights' bytes) of type ``kind``
    (``BLOCK_BYTES``) with ``n`` rows of ``k`` weights, decoded (module glossary)."""
    if kind not in BLOCK_BYTES:
        raise ValueError(f"GGUF type must be one of {', '.join(BLOCK_BYTES)}, got {kind!r}")
    size, per_block = BLOCK_BYTES[kind]
    if k % per_block:
        raise ValueError(f"a {kind} row holds a multiple of {per_block} weights, got {k}")
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if raw.size != n * k // per_block * size:
        raise ValueError(f"{kind} [{n}, {k}] needs {n * k // per_block * size} bytes, got {raw.size}")
    blocks = raw.reshape(-1, size)  # [B, size]
    if kind == "Q6_K":
        codes, scale, low = _q6_k(blocks)
    elif kind == "Q8_0":
        codes, scale, low = _q8_0(blocks)
    elif kind in ("Q4_0", "Q5_0", "Q5_1"):
        codes, scale, low = _legacy(blocks, kind)
    else:
        codes, scale, low = _q4_k(blocks, high_bits=kind == "Q5_K")
    group = codes.shape[-1]
    return Decoded(
        kind,
        torch.from_numpy(codes.astype(np.int8).reshape(n, k)),  # every type's codes fit int8
        torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32).reshape(n, k // group)),
        torch.from_numpy(np.ascontiguousarray(low, dtype=np.float32).reshape(n, k // group)),
        group,
    )


def rotary_unpermute(rows: int, heads: int) -> torch.Tensor:
    """The row order transformers gives a llama.cpp-permuted ``q``/``k`` projection of ``heads`` heads
    (module glossary: row order): row ``(head, half, i)`` of the result is the file's row
    ``(head, i, half)``."""
    dim = rows // heads // 2
    return torch.arange(rows).reshape(heads, dim, 2).transpose(1, 2).reshape(rows)


def match_rows(decoded: Decoded, weight: torch.Tensor, head_counts: tuple[int, ...]) -> Decoded | None:
    """``decoded`` in the row order whose weights equal ``weight [N, K]`` (the file's, or unpermuted for
    one of ``head_counts``), ``None`` when none does (module glossary: row order)."""
    if tuple(decoded.codes.shape) != tuple(weight.shape):
        return None
    target = weight.detach().float()
    rebuilt = decoded.weights()
    # per row: float32 rounding of the row's largest weight (the de-quantizers' arithmetic is ours, so
    # equal tensors match exactly; a small row is not excused by a large one elsewhere)
    tolerance = 4 * torch.finfo(torch.float32).eps * target.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    orders = [None] + [
        rotary_unpermute(weight.shape[0], h) for h in head_counts if weight.shape[0] % (2 * h) == 0
    ]
    for order in orders:
        candidate = rebuilt if order is None else rebuilt[order]
        if bool(((candidate - target).abs() <= tolerance).all()):
            return decoded if order is None else decoded.rows(order)
    return None


__all__ = ["BLOCK_BYTES", "QK_K", "Decoded", "decode", "match_rows", "rotary_unpermute"]
