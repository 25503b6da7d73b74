"""An engine step's forward through a Llama-shaped causal LM, composed from the model's own modules.

Why: around its model forwards transformers puts a stack of wrappers — keyword deprecation, config
defaults, output capture, tuple returns, mask construction, output dataclasses — that cost an engine step
about half a millisecond of Python on the 2-core reference VM (a tiny Llama's whole step is 2-3 ms there).
For the classes in ``LEAN_MODELS`` the runner makes the calls those forwards make, with the same arguments
and in the same order — ``embed_tokens``, ``rotary_emb``, every decoder layer, ``norm``, then ``lm_head``
over the rows the step keeps — and nothing else, so the logits are ``model(...)``'s bit for bit (tested
under the oldest and the newest transformers release the project supports). Hooks on the modules it calls
still fire (the hidden-state capture's among them); a model with hooks on the two forwards it skips runs
them.

Glossary: *kept rows* — the ``[B, Q]`` boolean ``logits_to_keep`` the runner passes: releases that take it
project only those rows (``hidden[keep]``), earlier ones project every row and the runner selects
(``mask_logits`` false), and this forward does what the installed release does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.modules.module as nn_module

from spec_backend.runtime.hf_compat import cache_kwargs

#: causal LM class -> its decoder class: whose forwards are exactly embed, rotary, layers, norm, lm_head
#: (any attention mask they build is ignored by the engine's attention, which reads the step's lengths)
LEAN_MODELS = {"LlamaForCausalLM": "LlamaModel", "MistralForCausalLM": "MistralModel"}


class LeanForward:
    """``model``'s engine-step forward as the module docstring says; build it with ``lean_forward``."""

    def __init__(self, model: Any, mask_logits: bool) -> None:
        self.model, self.decoder, self.mask_logits = model, model.model, mask_logits

    def hooked(self) -> bool:
        """Whether a hook sits on one of the two forwards this skips (then the model's forward runs)."""
        return hooked((self.model, self.decoder))

    def __call__(
        self,
        input_ids: torch.Tensor,  # [B, Q]
        position_ids: torch.Tensor,  # [B, Q]
        cache: Any,
        keep: torch.Tensor,  # [B, Q] bool
        **kwargs: Any,
    ) -> torch.Tensor:  # [R, V] logits of the kept rows, or [B, Q, V] where mask_logits is off
        hidden = self.decoder.embed_tokens(input_ids)  # [B, Q, H]
        rotary = self.decoder.rotary_emb(hidden, position_ids=position_ids)
        for layer in itertools.islice(self.decoder.layers, self.decoder.config.num_hidden_layers):
            hidden = layer(
                hidden, attention_mask=None, position_embeddings=rotary, position_ids=position_ids,
                **cache_kwargs(layer, cache), use_cache=True, **kwargs,
            )  # fmt: skip
        hidden = self.decoder.norm(hidden)
        logits: torch.Tensor = self.model.lm_head(hidden[keep] if self.mask_logits else hidden[:, 0:, :])
        return logits


def hooked(modules: Iterable[torch.nn.Module]) -> bool:
    """Whether a forward hook (or pre-hook) sits on one of ``modules``, or on every module (torch's global
    hooks): a caller that would skip their calls must make them instead."""
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def lean_forward(model: Any, mask_logits: bool) -> LeanForward | None:
    """The lean forward of ``model`` where its class and its decoder's are in ``LEAN_MODELS``, else
    ``None`` (the runner calls the model)."""
    decoder = getattr(model, "model", None)
    if LEAN_MODELS.get(type(model).__name__) != type(decoder).__name__:
        return None
    if not all(hasattr(decoder, name) for name in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return None
    return LeanForward(model, mask_logits)


__all__ = ["LEAN_MODELS", "LeanForward", "hooked", "lean_forward"]
