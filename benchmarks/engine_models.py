"""Random models the GPU engine benchmarks build (no network there): Llama-3.2-1B's and SmolLM2-135M's
shapes with random weights, and a random EAGLE-3 head for such a target."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from bench_drafter_cost import SMOLLM2 as SMOLLM2_SHAPE

#: Llama-3.2-1B's shape (1.24B parameters with tied embeddings).
LLAMA_1B = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
}

#: SmolLM2-135M-Instruct's shape (the bundled model's config), as the drafter-cost benchmark builds it
SMOLLM2 = {**SMOLLM2_SHAPE, "max_position_embeddings": 8192, "rope_theta": 100000.0}


def eagle3_head(folder: str, target: str) -> str:
    """A random EAGLE-3 head for ``target`` (speculators format) on its layers 0, L/2 and L-1."""
    from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3

    with open(os.path.join(target, "config.json")) as f:
        layers = int(json.load(f)["num_hidden_layers"])
    return write_eagle3(Path(folder), target, "speculators", aux_ids=[0, layers // 2, layers - 1])


def make_random_llama(directory: str, dry_run: bool, shape: dict[str, Any] | None = None) -> str:
    """Save a random Llama of ``shape`` (default 1B; tiny for a dry run) in ``directory``; return its path."""
    if dry_run:
        from spec_backend.tools.tiny import make_tiny_model

        return make_tiny_model(directory, vocab_size=256)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        config = LlamaConfig(**(shape or LLAMA_1B), torch_dtype=torch.bfloat16)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    del model
    return directory
