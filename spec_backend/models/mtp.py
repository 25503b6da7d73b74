"""Multi-token-prediction layers shipped inside the target checkpoint (``method="mtp"``).

The target's ``config.json`` says ``num_nextn_predict_layers`` = n. Where the layers are stored and how
one combines its inputs depends on the family (``mtp_layouts``: DeepSeek-V3/GLM ``model.layers.{L+i}.*``,
MiMo ``model.mtp_layers.{i}.*``, Qwen3-Next ``mtp.*``). Every layout holds, per layer:

* an embedding norm, a hidden norm and a projection ``[H, 2H]`` over their concatenation;
* a full decoder layer of the target's own kind (attention, MLP or MoE, two norms), loaded into the
  target's decoder-layer class; MoE experts stored one by one (``mlp.experts.{e}.{gate,up,down}_proj``)
  are stacked into transformers' fused ``gate_up_proj``/``down_proj``;
* an output norm. The embedding and LM head are the target's (as vLLM does; DeepSeek's shipped
  ``embed_tokens`` / ``shared_head.head`` copies are only shape-checked).

One row: ``x = proj(cat(enorm(embed(token_{t+1})), hnorm(h_t)))`` (order and position-0 masking per
layout), the decoder layer at position ``t`` on the head's own cache; the output (normalised inside the
layer for MiMo and Qwen3-Next) is the next row's ``h``; logits are the LM head over the normalised
output. Draft ``s`` uses layer ``s % n`` (vLLM's reuse when K > n); the committed rows always go through
layer 0.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from spec_backend.models.chain_head import ChainHead
from spec_backend.models.checkpoint import check_tensors, module_shapes, read_config, read_tensors
from spec_backend.models.mtp_layouts import DEEPSEEK, MtpLayout, layout_for, share_io
from spec_backend.runtime.hf_compat import cache_kwargs
from spec_backend.step import RaggedAttentionMetadata


class MtpLayer(torch.nn.Module):
    """One MTP layer: the two input norms, the projection, the decoder block and the output norm."""

    def __init__(self, block: torch.nn.Module, norm_cls: Any, hidden: int, eps: float) -> None:
        super().__init__()
        self.enorm, self.hnorm = norm_cls(hidden, eps=eps), norm_cls(hidden, eps=eps)
        self.eh_proj = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.block = block
        self.norm = norm_cls(hidden, eps=eps)


class MtpHead(ChainHead):
    """The MTP layers of a target (see the module docstring)."""

    def __init__(self, target: Any, num_layers: int, layout: MtpLayout = DEEPSEEK) -> None:
        from spec_backend.runtime.hidden import decoder_layers, decoder_of

        super().__init__()
        self.layout = layout
        text = target.config.get_text_config()
        n_target = int(text.num_hidden_layers)
        decoder = decoder_of(target)
        layer_cls = type(decoder_layers(target, n_target)[0])
        norm_cls = type(decoder.norm)
        hidden, eps = int(text.hidden_size), float(text.rms_norm_eps)
        block_config = copy.copy(text)
        if getattr(text, "layer_types", None) is not None:  # MTP blocks are full-attention layers
            block_config.layer_types = [*text.layer_types, *["full_attention"] * num_layers]
        layers = []
        for i in range(num_layers):
            block: Any = layer_cls(
                block_config, n_target + i
            )  # the index picks dense vs MoE as in the target
            block.self_attn.layer_idx = i  # its slot in the head's own cache
            layers.append(MtpLayer(block, norm_cls, hidden, eps))
        self.mtp = torch.nn.ModuleList(layers)
        self.config = copy.copy(text)
        self.config.num_hidden_layers = num_layers
        # the target's modules, held in tuples so they are not parameters of the head
        self.rotary: tuple[Any, ...] = (decoder.rotary_emb,)
        self.embed: tuple[Any, ...] = (target.get_input_embeddings(),)
        self.lm_head: tuple[Any, ...] = (target.get_output_embeddings(),)

    def step_kinds(self) -> int:
        return len(self.mtp)  # draft step s runs layer s % len(self.mtp)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, Q]
        hidden: torch.Tensor,  # [B, Q, H]
        position_ids: torch.Tensor,  # [B, Q]
        cache: Any,
        meta: RaggedAttentionMetadata,
        step: int = 0,
    ) -> torch.Tensor:  # [B, Q, H]
        layer: Any = self.mtp[step % len(self.mtp)]
        e = layer.enorm(self.embed[0](input_ids).to(hidden.dtype))  # [B, Q, H]
        if self.layout.mask_first_position:
            e = torch.where((position_ids == 0)[..., None], torch.zeros_like(e), e)
        h = layer.hnorm(hidden)  # [B, Q, H]
        x = layer.eh_proj(torch.cat([h, e] if self.layout.hidden_first else [e, h], dim=-1))  # [B, Q, H]
        out: torch.Tensor = layer.block(
            x,
            attention_mask=None,
            position_ids=position_ids,
            **cache_kwargs(layer.block, cache),
            use_cache=True,
            position_embeddings=self.rotary[0](x, _rope_positions(self.rotary[0], position_ids)),
            spec_attn_metadata=meta,
        )
        return layer.norm(out) if self.layout.norm_out else out

    def logits(self, out: torch.Tensor, step: int = 0) -> torch.Tensor:  # [B, H] -> [B, V]
        layer: Any = self.mtp[step % len(self.mtp)]
        logits: torch.Tensor = self.lm_head[0](out if self.layout.norm_out else layer.norm(out))
        return logits


def _rope_positions(rotary: Any, position_ids: torch.Tensor) -> torch.Tensor:
    """Positions as ``rotary`` reads them: ``[3, B, Q]`` for a multimodal rotary (``mrope_section``, Qwen3.5;
    transformers 5.17 and earlier index three axes, later releases expand ``[B, Q]`` themselves), else
    ``[B, Q]``. A text token sits at the same position on every axis."""
    if getattr(rotary, "mrope_section", None) is None:
        return position_ids
    return position_ids[None].expand(3, -1, -1)  # [3, B, Q]


_SHARED = ("embed_tokens.weight", "shared_head.head.weight")


def _fuse_experts(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]]) -> None:
    """Stack per-expert MoE weights into transformers' fused ``gate_up_proj [E, 2I, H]``/``down_proj``."""
    for name in [n for n in expected if n.endswith("mlp.experts.gate_up_proj")]:
        prefix, count = name[: -len("gate_up_proj")], expected[name][0]
        parts = [f"{prefix}{e}.{p}_proj.weight" for e in range(count) for p in ("gate", "up", "down")]
        if all(p in tensors for p in parts):
            gate_up = [
                torch.cat([tensors[f"{prefix}{e}.{p}_proj.weight"] for p in ("gate", "up")])
                for e in range(count)
            ]
            tensors[name] = torch.stack(gate_up)  # [E, 2I, H]
            tensors[prefix + "down_proj"] = torch.stack(
                [tensors[f"{prefix}{e}.down_proj.weight"] for e in range(count)]
            )
            for p in parts:
                del tensors[p]


def load_mtp_head(path: str, target: Any, num_layers: int, dtype: torch.dtype) -> MtpHead:
    """The first ``num_layers`` MTP layers of the target checkpoint at ``path`` (every shape checked)."""
    text = target.config.get_text_config()
    n_target, hidden = int(text.num_hidden_layers), int(text.hidden_size)
    shipped = getattr(text, "num_nextn_predict_layers", None)
    layout = layout_for(read_config("MTP", path).get("model_type"))
    first = layout.first_tensor.replace("{L}", str(n_target))
    if not isinstance(shipped, int) or shipped < num_layers:
        raise ValueError(
            f"the target checkpoint {path!r} declares num_nextn_predict_layers={shipped!r}; method='mtp' "
            f"needs {num_layers} MTP layer(s) ({layout.family} layout, starting with {first})"
        )
    tensors: dict[str, Any] = read_tensors("MTP", path, layout.rename(n_target, num_layers))
    if not tensors:
        raise ValueError(
            f"the target checkpoint {path!r} has no MTP weights: expected the {layout.family} layout "
            f"({first}, its norms and a decoder layer; num_nextn_predict_layers={shipped})"
        )
    if layout.shared_io:
        share_io(tensors, num_layers)
    head = MtpHead(target, num_layers, layout)
    expected = module_shapes(head)
    _fuse_experts(tensors, expected)
    vocab = int(target.get_input_embeddings().weight.shape[0])
    shared = {f"shared.{i}.{n}": (vocab, hidden) for i in range(num_layers) for n in _SHARED}
    check_tensors("MTP", path, expected, tensors, optional=shared)
    wrong = [
        f"{n}: {list(t.shape)}" for n, t in tensors.items() if n in shared and tuple(t.shape) != shared[n]
    ]
    if wrong:
        raise ValueError(f"MTP checkpoint {path!r}: shared tensors must be [{vocab}, {hidden}], got {wrong}")
    head.load_state_dict({n: t for n, t in tensors.items() if n not in shared}, strict=True)
    return head.to(device=next(target.parameters()).device, dtype=dtype).eval()


__all__ = ["MtpHead", "MtpLayer", "load_mtp_head"]
