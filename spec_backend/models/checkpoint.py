"""Reading a draft checkpoint folder (``config.json`` + safetensors) and checking its tensors against
the shapes its config implies, with one clear error."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch


def read_config(kind: str, path: str) -> dict[str, Any]:
    """``path/config.json`` as a dict; ``ValueError`` naming ``kind`` when it is missing or not an object."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ValueError(f"{kind} checkpoint {path!r} has no config.json")
    with open(config_path, encoding="utf-8") as f:
        raw = json.load(f)
    if not isinstance(raw, dict):
        raise ValueError(
            f"{kind} checkpoint {path!r}: config.json must hold a JSON object, got {type(raw).__name__}"
        )
    return raw


def read_tensors(
    kind: str, path: str, rename: Callable[[str], str | None] = lambda name: name
) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's ``*.safetensors`` files, renamed (``None`` drops a tensor).

    Pickled weights (``*.bin``, ``*.pt``) are refused: loading a pickle can run code.
    """
    from safetensors.torch import load_file

    if not os.path.isdir(path):
        raise ValueError(f"{kind} checkpoint {path!r} is not a folder")
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files:
        pickles = sorted(n for n in os.listdir(path) if n.endswith((".bin", ".pt", ".pth")))
        hint = f" (found pickles {pickles}: convert them with safetensors.torch.save_file)" if pickles else ""
        raise ValueError(f"{kind} checkpoint {path!r} has no .safetensors weights{hint}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(os.path.join(path, file)).items():
            new = rename(name)
            if new is not None:
                tensors[new] = tensor
    return tensors


def check_tensors(
    kind: str,
    path: str,
    expected: Mapping[str, tuple[int, ...]],
    tensors: Mapping[str, torch.Tensor],
    optional: Iterable[str] = (),
) -> None:
    """Raise ``ValueError`` naming every missing, unexpected and mis-shaped tensor of ``kind`` at ``path``."""
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected) - set(optional))
    wrong = [
        f"{k}: {list(tensors[k].shape)} (expected {list(s)})"
        for k, s in expected.items()
        if k in tensors and tuple(tensors[k].shape) != s
    ]
    if missing or extra or wrong:
        raise ValueError(
            f"{kind} checkpoint {path!r} does not match its config.json: missing {missing}, "
            f"unexpected {extra}, wrong shapes {wrong}"
        )


def module_shapes(module: torch.nn.Module, skip: Iterable[str] = ()) -> dict[str, tuple[int, ...]]:
    """The shapes a module's ``state_dict`` expects, minus the names in ``skip`` (shared weights)."""
    skipped = set(skip)
    return {k: tuple(v.shape) for k, v in module.state_dict().items() if k not in skipped}


def shipped_embedding(tensors: dict[str, torch.Tensor], default: torch.nn.Module) -> torch.nn.Module:
    """The checkpoint's own ``embed_tokens.weight [V, H]`` as a frozen embedding (popped from
    ``tensors``), else ``default`` (the target's)."""
    weight = tensors.pop("embed_tokens.weight", None)
    if weight is None:
        return default
    return torch.nn.Embedding(weight.shape[0], weight.shape[1], _weight=weight, _freeze=True)


__all__ = ["check_tensors", "module_shapes", "read_config", "read_tensors", "shipped_embedding"]
