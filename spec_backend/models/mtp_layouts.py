"""Where each model family stores its MTP layers inside the target checkpoint, and how one layer
combines its two inputs. Every layout maps its tensor names onto the same head (``MtpHead``):
``mtp.{i}.enorm`` (embedding norm), ``hnorm`` (hidden norm), ``eh_proj`` (the ``[H, 2H]`` projection),
``norm`` (output norm) and ``block.*`` (a decoder layer of the target's class).

* **deepseek** (DeepSeek-V3, GLM-4.5/4.6, ...): ``model.layers.{L+i}.{enorm,hnorm,eh_proj,
  shared_head.norm}`` + the block's own names; concatenation ``[embedding, hidden]``; the embedding is
  zeroed at position 0; the layer's raw output is the next hidden and ``shared_head.norm`` comes before
  the LM head.
* **mimo** (Xiaomi MiMo): ``model.mtp_layers.{i}.{token_layernorm, hidden_layernorm, input_proj,
  final_layernorm}`` + the block's names; concatenation ``[hidden, embedding]``; embedding zeroed at
  position 0; ``final_layernorm`` is applied inside the layer, so its normalised output is both the next
  hidden and the LM head's input.
* **qwen3_next** (Qwen3-Next, and Qwen3.5 which stores the same names): one
  ``mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm}`` shared by every ``mtp.layers.{i}.*``
  block; concatenation ``[embedding, hidden]``; no masking at position 0; normalised output as for mimo.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

Rename = Callable[[str], "str | None"]

_IO = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "norm.weight")


@dataclass(frozen=True)
class MtpLayout:
    """One family's storage and combination rules (module docstring)."""

    family: str
    hidden_first: bool  # concatenate [hidden, embedding] (else [embedding, hidden])
    norm_out: bool  # the output norm is applied inside the layer (its output is the next hidden)
    mask_first_position: bool  # zero the embedding at position 0
    shared_io: bool  # one set of norms and projection for every layer
    first_tensor: str  # layer 0's projection as stored, for errors ("{L}": the target's layer count)
    names: dict[str, str]  # stored name -> head name of the per-layer (or shared) input/output tensors

    def rename(self, n_target: int, num_layers: int) -> Rename:
        """Checkpoint name -> head name (``mtp.{i}.*`` or ``shared.{i}.*``); ``None`` for other tensors."""
        pattern = {
            "deepseek": r"model\.layers\.(\d+)\.(.+)",
            "mimo": r"model\.mtp_layers\.(\d+)\.(.+)",
            "qwen3_next": r"mtp\.layers\.(\d+)\.(.+)",
        }[self.family]
        layer_re = re.compile(pattern)
        offset = n_target if self.family == "deepseek" else 0

        def rename(name: str) -> str | None:
            if self.shared_io and name in self.names:  # qwen3_next: mtp.fc.weight, ...
                return f"mtp.0.{self.names[name]}"
            m = layer_re.fullmatch(name)
            if m is None or not offset <= int(m[1]) < offset + num_layers:
                return None  # the target's own weights, or layers beyond the ones used
            i, rest = int(m[1]) - offset, m[2]
            if rest in ("embed_tokens.weight", "shared_head.head.weight"):
                return f"shared.{i}.{rest}"
            if rest in self.names:
                return f"mtp.{i}.{self.names[rest]}"
            return f"mtp.{i}.block.{rest}"

        return rename


DEEPSEEK = MtpLayout(
    "deepseek",
    hidden_first=False,
    norm_out=False,
    mask_first_position=True,
    shared_io=False,
    first_tensor="model.layers.{L}.eh_proj.weight",
    names={
        "enorm.weight": "enorm.weight",
        "hnorm.weight": "hnorm.weight",
        "eh_proj.weight": "eh_proj.weight",
        "shared_head.norm.weight": "norm.weight",
    },
)
MIMO = MtpLayout(
    "mimo",
    hidden_first=True,
    norm_out=True,
    mask_first_position=True,
    shared_io=False,
    first_tensor="model.mtp_layers.0.input_proj.weight",
    names={
        "token_layernorm.weight": "enorm.weight",
        "hidden_layernorm.weight": "hnorm.weight",
        "input_proj.weight": "eh_proj.weight",
        "final_layernorm.weight": "norm.weight",
    },
)
QWEN3_NEXT = MtpLayout(
    "qwen3_next",
    hidden_first=False,
    norm_out=True,
    mask_first_position=False,
    shared_io=True,
    first_tensor="mtp.fc.weight",
    names={
        "mtp.pre_fc_norm_embedding.weight": "enorm.weight",
        "mtp.pre_fc_norm_hidden.weight": "hnorm.weight",
        "mtp.fc.weight": "eh_proj.weight",
        "mtp.norm.weight": "norm.weight",
    },
)

#: The checkpoint's ``model_type`` -> its layout (any other ``model_type``: the deepseek layout).
LAYOUT_BY_MODEL_TYPE = {
    "mimo": MIMO,
    "qwen3_next": QWEN3_NEXT,
    **dict.fromkeys(("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), QWEN3_NEXT),
}


def layout_for(model_type: object) -> MtpLayout:
    """The layout of a target checkpoint whose ``config.json`` says ``model_type``."""
    return LAYOUT_BY_MODEL_TYPE.get(str(model_type), DEEPSEEK)


def share_io(tensors: dict[str, object], num_layers: int) -> None:
    """Qwen3-Next: copy layer 0's shared norms and projection to every other layer's names."""
    for i in range(1, num_layers):
        for name in _IO:
            if f"mtp.0.{name}" in tensors:
                tensors[f"mtp.{i}.{name}"] = tensors[f"mtp.0.{name}"]


__all__ = ["DEEPSEEK", "LAYOUT_BY_MODEL_TYPE", "MIMO", "QWEN3_NEXT", "MtpLayout", "layout_for", "share_io"]
