"""Exact laws of tiny models for the engine's statistical tests (enumeration in float64)."""

from __future__ import annotations

from itertools import product

import torch

from spec_backend.testing.exact import SeqDist


def exact_law(model_dir: str, prompt: list[int], vocab: int, length: int) -> SeqDist:
    """P(x_1..x_length | prompt) at temperature 1 for every sequence over ``vocab`` tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    law: SeqDist = {}
    for seq in product(range(vocab), repeat=length):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + list(seq[:-1])])).logits[0, len(prompt) - 1 :]  # [L, V]
        probs = torch.softmax(logits, dim=-1)
        law[seq] = float(torch.prod(probs[torch.arange(length), torch.tensor(seq)]))
    return law
