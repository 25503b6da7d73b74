"""A checkpoint folder's files read with errors that name the folder, the file and what to do.

Shared by the target loader (``runtime.loader``), the GGUF cache (``runtime.gguf_cache``), the speculative
config (``engine.spec_config``) and every draft-head reader (``models.checkpoint``), so a truncated
``model.safetensors`` or a ``config.json`` that is not JSON gives the same ``ModelLoadError`` wherever it
is found.

Glossary:

* **safetensors header** — a file's first 8 bytes (little-endian ``u64`` header length ``N``), then ``N``
  bytes of JSON: ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``;
  the tensor data follows and must end exactly at the file's end. Checking it reads only the header, so
  it costs microseconds even for a large checkpoint.
* **integer weight** — a tensor stored with an integer or bool dtype (``I8``, ``I32``, ``BOOL``, ...)
  where the model holds a floating-point parameter: loading would cast it silently (``3`` becomes
  ``3.0``), so it is refused. Integer tensors the formats define (EAGLE-3's ``d2t``/``t2d``) and the
  integer parameters of quantized layers are not floating in the model, so they are not affected.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping
from typing import Any


class ModelLoadError(ValueError):
    """The model could not be found or loaded (unknown path, unsupported GGUF architecture, ...)."""


#: safetensors dtypes that are not floating point (``F16``, ``BF16``, ``F32``, ``F8_*`` ... are)
INTEGER_DTYPES = frozenset({"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})

#: headers larger than this are refused as damaged (safetensors' own limit is 100 MB)
_MAX_HEADER = 100_000_000

_REDO = "download or save the checkpoint again"


def read_json_config(folder: str, what: str) -> dict[str, Any] | None:
    """``folder/config.json`` as a dict, ``None`` when there is none; ``ModelLoadError`` naming ``what``
    and ``folder`` when it cannot be read, is not JSON, or is not a JSON object."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{what} {folder!r}: cannot read config.json ({exc}); {_REDO}") from exc
    except json.JSONDecodeError as exc:
        raise ModelLoadError(
            f"{what} {folder!r}: config.json is not valid JSON ({exc.msg} at line {exc.lineno}, column "
            f"{exc.colno}); the file is damaged or truncated: {_REDO}"
        ) from exc
    if not isinstance(raw, dict):
        raise ModelLoadError(
            f"{what} {folder!r}: config.json must hold a JSON object, got {type(raw).__name__}"
        )
    return raw


def safetensors_header(file: str) -> dict[str, Any]:
    """The tensors of a safetensors file's header (``__metadata__`` left out), after checking that the
    header parses and the data it describes ends exactly at the file's end; ``ValueError`` saying what
    is wrong otherwise."""
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"the file has {size} bytes, fewer than the 8 of a header length")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, _MAX_HEADER):
            raise ValueError(f"the header claims {length} bytes but the file has {size}")
        text = f.read(length)
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise ValueError(f"the header must be a JSON object, got {type(header).__name__}")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    bad = [
        k for k, v in tensors.items() if not isinstance(v, dict) or not {"dtype", "data_offsets"} <= set(v)
    ]
    if bad:
        raise ValueError(f"the header's entries {bad[:4]} lack dtype or data_offsets")
    try:
        ends = [int(v["data_offsets"][1]) for v in tensors.values()]
    except (TypeError, IndexError, ValueError) as exc:
        raise ValueError(f"a tensor's data_offsets are not [begin, end] ({exc})") from exc
    data = size - 8 - length
    if max(ends, default=0) != data:
        raise ValueError(
            f"its tensors need {max(ends, default=0)} bytes of data after the header, the file holds {data}"
        )
    return tensors


def read_safetensors_dtypes(folder: str, what: str) -> dict[str, str]:
    """Every tensor name of ``folder``'s ``*.safetensors`` files → its safetensors dtype (``"F32"``,
    ``"I8"``, ...); ``ModelLoadError`` naming the first file whose header does not parse or whose data
    is cut short."""
    dtypes: dict[str, str] = {}
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".safetensors")):
        try:
            tensors = safetensors_header(os.path.join(folder, name))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(
                f"{what} {folder!r}: {name} is not a readable safetensors file: {exc}. It is truncated "
                f"or damaged (an interrupted download or copy?): {_REDO}"
            ) from exc
        dtypes.update({k: str(v["dtype"]) for k, v in tensors.items()})
    return dtypes


def refuse_integer_weights(
    what: str, folder: str, stored: Mapping[str, str], floating: Iterable[str]
) -> None:
    """``ModelLoadError`` when a tensor the model holds as floating point (``floating``: names) is stored
    with an integer dtype (``stored``: name → safetensors dtype); see the module glossary."""
    wrong = sorted(f"{k} ({stored[k]})" for k in floating if stored.get(k) in INTEGER_DTYPES)
    if wrong:
        raise ModelLoadError(
            f"{what} {folder!r} stores floating-point weights as integers: {wrong[:6]}"
            f"{f' and {len(wrong) - 6} more' if len(wrong) > 6 else ''}; the model needs F32, F16 or BF16 "
            "tensors there (quantized checkpoints load from GGUF). Save the checkpoint with floating weights"
        )


def gguf_architecture(reader: Any) -> str:
    """The ``general.architecture`` string of an open ``gguf.GGUFReader`` (``llama``, ``qwen2``, ...)."""
    field = reader.fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


__all__ = [
    "INTEGER_DTYPES",
    "ModelLoadError",
    "gguf_architecture",
    "read_json_config",
    "read_safetensors_dtypes",
    "refuse_integer_weights",
    "safetensors_header",
]
