"""EAGLE-1 draft head (``method="eagle"``), loaded from the published checkpoint format.

Format (e.g. ``yuhuili/EAGLE-LLaMA3-Instruct-8B``): ``config.json`` is a ``LlamaConfig`` with the target's
hidden size, heads and vocabulary, ``num_hidden_layers`` (1), and ``bias`` (whether ``fc`` has a bias);
``model.safetensors`` holds ``fc.weight [H, 2H]``, optional ``fc.bias [H]``, the decoder layers
``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
``layers.{i}.post_attention_layernorm.weight`` and ``layers.{i}.input_layernorm.weight`` for i >= 1 only
(**layer 0 has no input norm**), and optionally ``embed_tokens.weight`` (else the target's). There is no
final norm and no LM head: logits come from the target's LM head.

One row (``forward``): ``x = fc(cat(embed(token_{t+1}), h_t))``, then the decoder layers at position
``t`` on the head's own KV cache; the output is both the row's hidden state (fed back as ``h`` for the
next draft) and the input of the target's LM head.
"""

from __future__ import annotations

from typing import Any

import torch

from spec_backend.models.chain_head import ChainHead, run_layers
from spec_backend.models.checkpoint import (
    check_rows,
    check_tensors,
    module_shapes,
    read_config,
    read_tensors,
    shipped_embedding,
)
from spec_backend.step import RaggedAttentionMetadata


class EagleHead(ChainHead):
    """The EAGLE-1 head (see the module docstring). ``embed``/``lm_head``: the target's, unless the
    checkpoint ships its own embedding."""

    def __init__(self, config: Any, bias: bool, embed: torch.nn.Module, lm_head: torch.nn.Module) -> None:
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        super().__init__()
        hidden = int(config.hidden_size)
        self.config = config
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=bias)
        self.layers = torch.nn.ModuleList(
            [LlamaDecoderLayer(config, i) for i in range(int(config.num_hidden_layers))]
        )
        self.layers[0].input_layernorm = torch.nn.Identity()  # EAGLE-1: no input norm on layer 0
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.embed = embed
        self.lm_head = lm_head

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, Q]
        hidden: torch.Tensor,  # [B, Q, H]
        position_ids: torch.Tensor,  # [B, Q]
        cache: Any,
        meta: RaggedAttentionMetadata,
        step: int = 0,
    ) -> torch.Tensor:  # [B, Q, H]
        e = self.embed(input_ids).to(hidden.dtype)  # [B, Q, H]
        x: torch.Tensor = self.fc(torch.cat([e, hidden], dim=-1))  # [B, Q, 2H] -> [B, Q, H]
        return run_layers(self.layers, x, position_ids, self.rotary_emb(x, position_ids), cache, meta)

    def logits(self, out: torch.Tensor, step: int = 0) -> torch.Tensor:  # [B, H] -> [B, V]
        logits: torch.Tensor = self.lm_head(out)
        return logits


def load_eagle_head(path: str, target: Any, attn_name: str, dtype: torch.dtype) -> EagleHead:
    """Load an EAGLE-1 checkpoint folder for ``target`` (checked: hidden size and vocabulary)."""
    from transformers import LlamaConfig

    raw = read_config("EAGLE", path)
    config = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "bias")})
    config._attn_implementation = attn_name
    tensors = read_tensors("EAGLE", path)
    target_h = int(target.get_input_embeddings().weight.shape[1])
    if int(config.hidden_size) != target_h:
        raise ValueError(
            f"EAGLE head {path!r} has hidden_size {config.hidden_size}, the target has {target_h}"
        )
    vocab = int(target.get_output_embeddings().weight.shape[0])  # EAGLE-1 drafts with the target's head
    if int(config.vocab_size) != vocab:
        raise ValueError(
            f"EAGLE head {path!r} has vocab_size {config.vocab_size} in its config.json, the target has "
            f"{vocab} tokens; an EAGLE-1 head drafts with the target's LM head and needs its vocabulary"
        )
    check_rows("EAGLE", path, tensors.get("embed_tokens.weight"), "embed_tokens.weight", vocab, "vocab_size")
    bias = "fc.bias" in tensors  # load the bias iff it is there (config["bias"] is only a hint)
    embed = shipped_embedding(tensors, target.get_input_embeddings())
    head = EagleHead(config, bias, embed, target.get_output_embeddings())
    check_tensors("EAGLE", path, module_shapes(head, skip=["embed.weight", "lm_head.weight"]), tensors)
    head.load_state_dict(tensors, strict=False)
    return head.to(device=next(target.parameters()).device, dtype=dtype).eval()


__all__ = ["EagleHead", "load_eagle_head"]
