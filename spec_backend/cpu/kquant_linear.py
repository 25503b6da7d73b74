"""Linear layers of GGUF k-quant (Q4_K, Q5_K, Q6_K), Q8_0 and Q4_0/Q5_0/Q5_1 models run from the file's
own blocks.

Glossary:

* **blocks** — ``read_blocks(model, gguf_file)``: for each of the model's CPU ``nn.Linear`` layers whose
  GGUF tensor is one of ``gguf_blocks.BLOCK_BYTES``'s types, its decoded codes, scales and offsets
  (``gguf_blocks``), keyed by ``id`` of the layer's weight (copies of a layer that share the weight find
  them too, as ``fast_path``'s measurement makes). A tensor is used only when it re-creates the weight
  transformers loaded (``gguf_blocks.match_rows``); one that does not is logged and keeps float32.
* **Q4_K on the Q4_1 kernel** — a Q4_K sub-block of 32 is ``w = (d·sc)·q − dmin·m`` and a Q4_0 block
  ``w = d·q − 8d``: Q4_1 blocks with a float32 scale and minimum. So Q4_K and Q4_0 layers become
  ``int4_linear.Int4Linear`` layers (the measured path's kernel: ours with int8 activations, or torch's
  with bfloat16 ones), lossy as Q4_1 is, and decoder layers made only of them run as one native call
  (``native_layer``).
* **k8 kernel** — Q5_K, Q6_K, Q8_0, Q5_0 and Q5_1 layers (and Q4_K/Q4_0 where no Q4_1 kernel takes them) run
  on ``csrc/q8_0_gemm.cpp``'s ``k8_mm``: int8 codes with a float32 scale and offset per 16 weights, or, for
  the types without offsets and with one scale per 32 (Q8_0, Q5_0; Q4_0 where no Q4_1 kernel takes it), a
  float32 scale per 32 and no offset; float32 activations. ``scale·code`` is the de-quantized weight exactly
  (``gguf_blocks``) and one rounding adds the offset, as the de-quantizer does, so the product equals the
  float32 layer's up to summation order: **not lossy**, and a row's result does not depend on the batch. It
  reads 12 bits per weight (8 for the code, 4 for the per-16 scale and offset), 9 for Q8_0 and Q5_0, against
  the file's 5.5 (Q5_K, Q5_0), 6 (Q5_1), 6.56 (Q6_K) or 8.5 (Q8_0) and float32's 32.
* **head** — an untied LM head with such a tensor (llama.cpp's k-quant mixes store it as Q6_K) runs on
  the k8 kernel too and keeps its float32 ``weight`` (drafters and the engine read it); a tied head is the
  token embedding, whose Q8_0 blocks ``q8_0_projection`` recovers.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from spec_backend.cpu.gguf_blocks import BLOCK_BYTES, Decoded, decode, match_rows
from spec_backend.cpu.int4_linear import PackedLinear
from spec_backend.cpu.native import required_op
from spec_backend.cpu.vocab_projection import output_embedding, replace_modules
from spec_backend.runtime.checkpoint_files import gguf_architecture

logger = logging.getLogger("spec_backend.backends")

#: the k8 kernel's offset group: 16 weights (Q6_K's sub-block; a 32-weight scale covers two groups)
K8_GROUP = 16


def _gguf_tensors(gguf_file: str) -> tuple[str, dict[str, Any]]:
    """The file's architecture name and its tensors by name."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf_file)
    return gguf_architecture(reader), {t.name: t for t in reader.tensors}


def _name_map(arch: str, layers: int) -> Any:
    import gguf

    by_name = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in by_name:
        return None
    return gguf.get_tensor_name_map(by_name[arch], layers)


def read_blocks(model: nn.Module, gguf_file: str) -> dict[int, Decoded]:
    """The decoded GGUF blocks of ``model``'s linear layers (module glossary), by ``id`` of their weight."""
    config = getattr(model, "config", None)
    arch, tensors = _gguf_tensors(gguf_file)
    names = _name_map(arch, int(getattr(config, "num_hidden_layers", 0) or 0))
    if names is None:
        return {}
    heads = tuple(
        int(h)
        for h in (getattr(config, "num_attention_heads", 0), getattr(config, "num_key_value_heads", 0))
        if h
    )
    found: dict[int, Decoded] = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if type(module) is not nn.Linear or weight is None or weight.device.type != "cpu":
            continue
        if weight.dtype != torch.float32:  # loaded in another dtype: the float32 kernels do not apply
            continue
        tensor = tensors.get(names.get_name(f"{name}.weight", try_suffixes=(".weight",)) or "")
        if tensor is None or tensor.tensor_type.name not in BLOCK_BYTES:
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists the row length first
        decoded = None
        if shape == tuple(weight.shape):
            decoded = match_rows(decode(tensor.tensor_type.name, tensor.data, *shape), weight, heads)
        if decoded is None:
            logger.warning(
                "spec_backend: GGUF tensor %s (%s, %s) does not re-create %s %s as loaded; it stays float32",
                tensor.name,
                tensor.tensor_type.name,
                list(shape),
                name,
                list(weight.shape),
            )
            continue
        found[id(module.weight)] = decoded
    return found


class K8Linear(PackedLinear):
    """An ``nn.Linear`` replaced by its decoded GGUF blocks on the k8 kernel (module glossary); float32."""

    def __init__(self, linear: nn.Linear, decoded: Decoded, keep_weight: bool = False) -> None:
        if tuple(decoded.codes.shape) != (linear.out_features, linear.in_features):
            raise ValueError(
                f"decoded {decoded.kind} codes must be [out, in] = [{linear.out_features}, "
                f"{linear.in_features}], got {list(decoded.codes.shape)}"
            )
        super().__init__(linear)
        if keep_weight:  # the LM head: drafters and the engine read its weight  # [N, K]
            self.weight = linear.weight
        self.activation_dtype = torch.float32
        self.kind = decoded.kind
        self.codes: torch.Tensor
        self.scale: torch.Tensor
        self.low: torch.Tensor
        self.register_buffer("codes", decoded.codes.to(torch.int8).contiguous())  # [N, K]
        if decoded.group == 32 and not bool(decoded.low.any()):  # Q8_0, Q5_0: w = d·q per 32
            self.register_buffer("scale", decoded.scale.contiguous())  # [N, K/32]
            self.register_buffer("low", torch.empty(0))  # none: the kernel's Q8_0 form
        else:
            repeat = decoded.group // K8_GROUP  # 2 for 32-weight scales, 1 for Q6_K's 16
            scale = decoded.scale.repeat_interleave(repeat, dim=1)  # [N, K/16]
            self.register_buffer("scale", scale.contiguous())
            self.register_buffer(
                "low", decoded.low.repeat_interleave(repeat, dim=1).contiguous()
            )  # [N, K/16]
        self._op = required_op("k8_mm")  # the ISA variant selected now

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:  # [M, K] float32 -> [M, N]
        out: torch.Tensor = self._op(rows, self.codes, self.scale, self.low)
        return out


def install_k8_linears(model: nn.Module, blocks: dict[int, Decoded]) -> int:
    """Replace every plain ``nn.Linear`` of ``model`` whose weight has decoded blocks by a ``K8Linear``
    (Q4_K layers the Q4_1 kernel took are no longer plain; the LM head keeps its weight: module glossary);
    returns how many."""
    head = output_embedding(model)
    swaps = [
        (name, K8Linear(module, blocks[id(module.weight)]))
        for name, module in model.named_modules()
        if type(module) is nn.Linear and module is not head and id(module.weight) in blocks
    ]
    replaced = replace_modules(model, swaps)
    setter = getattr(model, "set_output_embeddings", None)
    if type(head) is nn.Linear and id(head.weight) in blocks and callable(setter):
        setter(K8Linear(head, blocks[id(head.weight)], keep_weight=True))
        replaced += 1
    return replaced


def block_kinds(model: nn.Module) -> dict[str, int]:
    """How many layers of ``model`` run from GGUF blocks, by type (``Int4Linear`` counts as Q4 either way)."""
    kinds: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, K8Linear):
            kinds[module.kind] = kinds.get(module.kind, 0) + 1
    return kinds


__all__ = ["K8_GROUP", "K8Linear", "block_kinds", "install_k8_linears", "read_blocks"]
