"""Training data for draft heads: the target's hidden states, extracted by the engine itself.

``extract`` runs each prompt (token ids) through ``LLM`` with ``method="extract_hidden_states"`` and
``max_tokens=1``, so each file holds exactly the prompt's rows: ``token_ids [T]`` and
``hidden_states [T, n, H]`` for the listed layer ids (id ``L`` = the last layer's output before the
final norm, from which the target's own next-token distribution is recomputed for the loss).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch


def extractor(target_dir: str, out_dir: str, layer_ids: Sequence[int]) -> Any:
    """An ``LLM`` that writes the listed layers' hidden states of each prompt under ``out_dir``."""
    from spec_backend.engine import LLM

    os.makedirs(out_dir, exist_ok=True)
    return LLM(
        target_dir,
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
        },
        kv_transfer_config={
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": out_dir},
        },
        log_stats_interval=None,
    )


def extract_with(llm: Any, prompts: Sequence[list[int]]) -> list[str]:
    """Run ``prompts`` through an ``extractor``; return the files' paths in prompt order."""
    from spec_backend.engine import SamplingParams

    outs = llm.generate([list(p) for p in prompts], SamplingParams(temperature=0.0, max_tokens=1))
    return [str(o.kv_transfer_params["hidden_states_path"]) for o in outs]


def extract(
    target_dir: str, prompts: Sequence[list[int]], out_dir: str, layer_ids: Sequence[int]
) -> list[str]:
    """Write one safetensors file per prompt under ``out_dir``; return their paths in prompt order."""
    return extract_with(extractor(target_dir, out_dir, layer_ids), prompts)


def respond(llm: Any, prompts: Sequence[str], max_tokens: int, seed: int) -> list[list[int]]:
    """The target's own answers to chat ``prompts`` (self-distillation data): each result is the
    chat-formatted prompt's token ids followed by the answer's. Even-numbered prompts are answered
    greedily (what greedy decoding will ask the head to draft), odd ones sampled at temperature 0.8
    with a per-prompt seed (more varied text, as sampled decoding asks)."""
    from spec_backend.engine import SamplingParams

    chats = [llm.chat_prompt(p) for p in prompts]
    params = [
        SamplingParams(temperature=0.0, max_tokens=max_tokens)
        if i % 2 == 0
        else SamplingParams(temperature=0.8, max_tokens=max_tokens, seed=seed + i)
        for i in range(len(prompts))
    ]
    outs = llm.generate(chats, params)
    return [list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in outs]


def load(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One extracted file: ``token_ids [T]`` and ``hidden_states [T, n, H]``."""
    from safetensors.torch import load_file

    tensors = load_file(path)
    return tensors["token_ids"], tensors["hidden_states"]


__all__ = ["extract", "extract_with", "extractor", "load", "respond"]
