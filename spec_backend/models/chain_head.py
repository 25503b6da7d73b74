"""The common shape of EAGLE-style draft heads (EAGLE-1, EAGLE-3, MTP): one draft token per forward.

Glossary:

* *row* ``t`` — the pair (hidden state ``h_t``, token ``t+1``) at position ``t``; its output predicts
  token ``t+2`` and is the hidden state fed with the next draft;
* *features* — what the target gives a committed row: its post-norm final state (EAGLE-1, MTP) or the
  concatenation of auxiliary layer states (EAGLE-3), ``[N, F]``;
* ``combine`` — maps features to the head's hidden size ``[N, F] -> [N, H]`` (EAGLE-3's ``fc``; the
  identity elsewhere); drafts feed the head's own outputs, which are already ``[*, H]``;
* *parallel drafting* — P-EAGLE: K-1 mask rows (mask token, ``mask_features()``) follow the committed
  rows in the same causal forward, so the last committed row and the mask rows give all K drafts;
* ``step`` — the draft index a forward serves (0 for the committed rows and the first draft); heads
  with several prediction layers (MTP) pick their layer by it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from spec_backend.runtime.hf_compat import cache_kwargs
from spec_backend.step import RaggedAttentionMetadata


class ChainHead(torch.nn.Module, ABC):
    """An EAGLE-style head (see the module docstring). ``config``: the HF config of its KV layout."""

    config: Any

    def combine(self, features: torch.Tensor) -> torch.Tensor:  # [N, F] -> [N, H]
        return features

    def step_kinds(self) -> int:
        """How many different forwards ``step`` selects: step ``s`` runs as step ``s % step_kinds()``
        (one: the head ignores it; MTP with several layers: its layer count)."""
        return 1

    def mask_features(self) -> torch.Tensor | None:  # [H]
        """The hidden input of parallel drafting's mask rows (P-EAGLE's ``fc(mask_hidden)``); ``None``
        for heads not trained for parallel drafting."""
        return None

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, Q]
        hidden: torch.Tensor,  # [B, Q, H]
        position_ids: torch.Tensor,  # [B, Q]
        cache: Any,
        meta: RaggedAttentionMetadata,
        step: int = 0,
    ) -> torch.Tensor:  # [B, Q, H]
        """The head's output for each row (fed back as the next row's hidden state)."""

    @abstractmethod
    def logits(
        self, out: torch.Tensor, step: int = 0
    ) -> torch.Tensor:  # [B, H] -> [B, V] over the target vocabulary
        """Draft logits over the target's vocabulary."""

    def draft_vocab_logits(
        self, out: torch.Tensor, step: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # [B, H] -> [B, Vd], [Vd] | None
        """Draft logits over the head's own vocabulary and the target id of each of its entries (``None``:
        the target's vocabulary): a greedy draft is the target id of their argmax, without spreading
        the logits over the whole target vocabulary first."""
        return self.logits(out, step), None

    def argmax_draft(self, out: torch.Tensor, step: int = 0) -> torch.Tensor:  # [B, H] -> [B] int64
        """A greedy draft: the target id of the argmax of ``draft_vocab_logits``."""
        logits, vocab = self.draft_vocab_logits(out, step)  # [B, Vd], [Vd] | None
        ids = logits.argmax(dim=-1)  # [B]
        return ids if vocab is None else vocab[ids]


def run_layers(
    layers: Any,
    x: torch.Tensor,  # [B, Q, H]
    position_ids: torch.Tensor,  # [B, Q]
    position_embeddings: Any,
    cache: Any,
    meta: RaggedAttentionMetadata | None,
    attention_mask: torch.Tensor | None = None,  # [B, 1, Q, KV] bool (training); None: the engine's
) -> torch.Tensor:  # [B, Q, H]
    """Ordinary transformers decoder layers over ``x`` on the head's own KV cache."""
    for layer in layers:
        x = layer(
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **cache_kwargs(layer, cache),
            use_cache=True,
            position_embeddings=position_embeddings,
            spec_attn_metadata=meta,
        )
    return x


def decoder_classes(model_type: str) -> tuple[Any, Any, Any]:
    """transformers' (decoder layer, RMSNorm, rotary embedding) classes for a dense ``model_type``."""
    import importlib

    prefixes = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral"}
    if model_type not in prefixes:
        raise ValueError(
            f"draft layers of model_type {model_type!r} are not supported; supported: {sorted(prefixes)}"
        )
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    p = prefixes[model_type]
    return (
        getattr(module, f"{p}DecoderLayer"),
        getattr(module, f"{p}RMSNorm"),
        getattr(module, f"{p}RotaryEmbedding"),
    )


__all__ = ["ChainHead", "decoder_classes", "run_layers"]
