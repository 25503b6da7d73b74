"""Tiny random causal LMs saved to disk, for tests and smoke runs without downloads."""

from __future__ import annotations

import os
from typing import Any

import torch

#: the tiny models' shapes and token ids (``testing/fixtures/families`` builds its families on them too)
TINY_SETTINGS: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
    "tie_word_embeddings": False,
}


def make_tiny_model(
    directory: str | os.PathLike[str],
    arch: str = "llama",
    vocab_size: int = 128,
    seed: int = 0,
    with_tokenizer: bool = False,
    **overrides: Any,
) -> str:
    """Save a randomly initialised 2-layer ``arch`` ("llama" or "qwen2") model to ``directory``.

    The model has no EOS token unless ``eos_token_id`` is passed. ``with_tokenizer`` also saves a
    character-level tokenizer (``make_tiny_tokenizer``). Returns the directory path.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in classes:
        raise ValueError(f"unknown tiny architecture {arch!r}; use one of {sorted(classes)}")
    config_cls, model_cls = classes[arch]
    settings = {**TINY_SETTINGS, "vocab_size": vocab_size, "num_hidden_layers": 2, **overrides}
    torch.manual_seed(seed)
    model = model_cls(config_cls(**settings))
    with torch.no_grad():  # larger logits spread: sharper distributions, fewer near-ties in argmax
        model.lm_head.weight.mul_(8.0)
    path = os.fspath(directory)
    model.save_pretrained(path)
    if with_tokenizer:
        make_tiny_tokenizer(path)
    return path


def make_tiny_tokenizer(directory: str | os.PathLike[str]) -> int:
    """Save a character-level tokenizer (printable ASCII; ``<unk>`` = 0, ``<eos>`` = 1); return its size."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1}
    for char in string.printable:
        if char not in "\x0b\x0c\r":
            vocab[char] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>")  # type: ignore[no-untyped-call]
    fast.save_pretrained(os.fspath(directory))
    return len(vocab)
