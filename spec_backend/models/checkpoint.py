"""Reading a draft checkpoint folder (``config.json`` + safetensors) and checking its tensors against
the shapes its config implies, with one clear error.

Every draft head (EAGLE, EAGLE-3, DFlash, Medusa, MLPSpeculator, MTP) reads its folder here: a
``config.json`` that is not JSON or a ``*.safetensors`` file that is truncated is a ``ModelLoadError``
naming the folder and the file (``runtime.checkpoint_files``), and a floating-point weight stored as
integers is refused by ``check_tensors``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from spec_backend.runtime.checkpoint_files import (
    ModelLoadError,
    read_json_config,
    read_safetensors_dtypes,
    refuse_integer_weights,
)


def read_config(kind: str, path: str) -> dict[str, Any]:
    """``path/config.json`` as a dict; ``ModelLoadError`` naming ``kind`` when it is missing, not JSON
    or not an object."""
    raw = read_json_config(path, f"{kind} checkpoint")
    if raw is None:
        raise ModelLoadError(f"{kind} checkpoint {path!r} has no config.json")
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
    read_safetensors_dtypes(path, f"{kind} checkpoint")  # a truncated or damaged file, named
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            loaded = load_file(os.path.join(path, file))
        except Exception as exc:  # safetensors' own SafetensorError: a damaged file the header check passed
            raise ModelLoadError(
                f"{kind} checkpoint {path!r}: cannot read {file} ({type(exc).__name__}: {exc}); "
                "download or save the checkpoint again"
            ) from exc
        for name, tensor in loaded.items():
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
    """Raise ``ValueError`` naming every missing, unexpected and mis-shaped tensor of ``kind`` at ``path``,
    and ``ModelLoadError`` when a tensor of ``expected`` (the module's weights, all floating point) is
    stored with an integer dtype."""
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
    stored = {k: _SAFETENSORS_DTYPE.get(t.dtype, str(t.dtype)) for k, t in tensors.items()}
    refuse_integer_weights(f"{kind} checkpoint", path, stored, expected)


def check_rows(kind: str, path: str, tensor: torch.Tensor | None, name: str, rows: int, field: str) -> None:
    """``ModelLoadError`` unless ``tensor`` (the checkpoint's ``name``, when it ships one) has ``rows`` rows,
    the vocabulary size its ``config.json`` or the target implies (``field`` says which)."""
    if tensor is not None and (tensor.dim() == 0 or int(tensor.shape[0]) != rows):
        found = tensor.shape[0] if tensor.dim() else 0
        raise ModelLoadError(
            f"{kind} checkpoint {path!r}: {name} has {found} rows (shape {list(tensor.shape)}) but "
            f"{field} is {rows}; the config.json and the weights must describe the same vocabulary"
        )


#: torch dtype -> safetensors' name for it (what ``refuse_integer_weights`` reads)
_SAFETENSORS_DTYPE = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
}


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


__all__ = [
    "check_rows",
    "check_tensors",
    "module_shapes",
    "read_config",
    "read_tensors",
    "shipped_embedding",
]
