"""A GGUF model de-quantized once into a safetensors folder under the user's cache directory.

Parsing and de-quantizing a GGUF file with transformers takes tens of seconds (the bundled SmolLM2:
~20 s); reading the same weights from safetensors takes about a second. ``materialize`` does the slow
part once and keeps the result, keyed by the SHA-256 of the GGUF file, so a changed file never reuses a
stale folder.

Glossary:

* **cache root** — ``spec_backend.paths.cache_root()``.
* **materialized folder** (a cache *slot*) — ``<cache root>/gguf/<stem>-<sha256[:16]>/``: ``config.json``
  (without the GGUF ``quantization_config``), ``model.safetensors`` (float32), the tokenizer files, the
  chat template, and ``SOURCE_RECORD``: the GGUF's path, size and full SHA-256. A plain Hugging Face
  folder: vLLM, transformers and this engine all load it.
* **valid slot** — its ``config.json`` parses to a JSON object, its ``model.safetensors`` header parses
  and its data ends where the file does (``checkpoint_files.safetensors_header``), and its source record
  names this GGUF's size and SHA-256 (``slot_problem``). A slot that is not valid (an interrupted copy, a
  damaged disk, a folder copied from another model, a slot written before the record existed) is
  rebuilt, with a warning naming the folder and the reason; when it cannot be replaced, a
  ``ModelLoadError`` says which folder to delete.

Concurrent first runs are safe: each writes into its own temporary folder beside the final one and
renames it into place; the loser of the race discards its copy and uses the winner's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from spec_backend.paths import cache_root
from spec_backend.runtime.checkpoint_files import ModelLoadError, safetensors_header
from spec_backend.runtime.sources import resolve_model

logger = logging.getLogger("spec_backend.engine")

_WEIGHTS = "model.safetensors"
#: the slot's record of the GGUF it was converted from (module glossary)
SOURCE_RECORD = "spec_backend_source.json"


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    """``file_sha256`` once per file version in this process (the engine asks for model and tokenizer)."""
    return file_sha256(path)


def _identity(gguf_path: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``SOURCE_RECORD`` holds for this GGUF file: its path, size and SHA-256."""
    path = Path(gguf_path).resolve()
    stat = path.stat()
    return {
        "gguf": str(path),
        "size": stat.st_size,
        "sha256": _digest(str(path), stat.st_size, stat.st_mtime_ns),
    }


def materialized_path(gguf_path: str | os.PathLike[str]) -> Path:
    """The folder ``materialize`` writes for this GGUF file (it may not exist yet)."""
    return cache_root() / "gguf" / f"{Path(gguf_path).stem}-{_identity(gguf_path)['sha256'][:16]}"


#: ``slot_problem``'s answer for a folder that holds no conversion (yet): written, not rebuilt
NOT_WRITTEN = "not written yet"


def slot_problem(folder: Path, gguf_path: str | os.PathLike[str]) -> str | None:
    """Why ``folder`` is not a valid slot for ``gguf_path`` (module glossary), or ``None`` when it is;
    ``NOT_WRITTEN`` when it holds no ``model.safetensors``."""
    if not (folder / _WEIGHTS).is_file():
        return NOT_WRITTEN
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"its config.json does not parse ({exc})"
    if not isinstance(config, dict):
        return f"its config.json holds a {type(config).__name__}, not a JSON object"
    try:
        safetensors_header(str(folder / _WEIGHTS))
    except (OSError, ValueError) as exc:
        return f"its {_WEIGHTS} is damaged ({exc})"
    try:
        record = json.loads((folder / SOURCE_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        return f"it has no readable {SOURCE_RECORD} saying which GGUF it was converted from"
    own = _identity(gguf_path)
    if (record.get("sha256"), record.get("size")) != (own["sha256"], own["size"]):
        return (
            f"it holds a conversion of another file: {record.get('gguf')!r} ({record.get('size')} bytes, "
            f"sha256 {record.get('sha256')}), not of {own['gguf']!r} ({own['size']} bytes, sha256 "
            f"{own['sha256']})"
        )
    return None


def is_materialized(folder: Path, gguf_path: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` (``materialized_path(gguf_path)``) is a valid slot for ``gguf_path``."""
    return slot_problem(folder, gguf_path) is None


def _write_folder(directory: str, gguf_file: str, out: Path) -> None:
    """De-quantize ``directory/gguf_file`` with transformers and save it as a float32 HF folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    loaded: Any = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32)
    # The GGUF loader records a quantization_config that save_pretrained refuses and that would make
    # the folder look quantized; the weights are plain float32 by now.
    settings = {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
    config = AutoConfig.for_model(**settings)
    auto: Any = AutoModelForCausalLM  # from_config is untyped in transformers
    model: Any = auto.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(
            f"de-quantized GGUF does not fit its own config: missing {missing}, unexpected {unexpected}"
        )
    model.tie_weights()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file).save_pretrained(out)


def materialize(directory: str, gguf_file: str) -> str:
    """The safetensors folder for ``directory/gguf_file``, writing it on first use and rebuilding it
    when it is not a valid slot (see the module doc)."""
    gguf_path = os.path.join(directory, gguf_file)
    final = materialized_path(gguf_path)
    problem = slot_problem(final, gguf_path)
    if problem is None:
        return str(final)
    if problem != NOT_WRITTEN:
        logger.warning(
            "spec_backend: the GGUF cache folder %s is not usable: %s; rebuilding it", final, problem
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    logger.info("spec_backend: de-quantizing %s once into %s", gguf_file, final)
    partial = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
    try:
        _write_folder(directory, gguf_file, partial)
        (partial / SOURCE_RECORD).write_text(json.dumps(_identity(gguf_path)), encoding="utf-8")
        _install(partial, final, gguf_path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return str(final)


def _install(partial: Path, final: Path, gguf_path: str) -> None:
    """Rename ``partial`` to ``final``, replacing an invalid slot there; keep a valid one another process
    installed meanwhile. ``ModelLoadError`` naming the folder to delete when the old one cannot move."""
    for _ in range(3):
        try:
            os.rename(partial, final)  # atomic; fails when a folder is there (another process, or damaged)
            return
        except OSError:
            problem = slot_problem(final, gguf_path)
            if problem is None:
                return  # another process got there first
            if not final.exists():
                raise
        stale = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale-", dir=final.parent))
        try:
            os.rename(final, stale / final.name)
        except OSError as exc:
            if final.exists() and slot_problem(final, gguf_path) is not None:
                raise ModelLoadError(
                    f"the GGUF cache folder {str(final)!r} is not usable ({problem}) and cannot be replaced "
                    f"({exc}); delete that folder and run again"
                ) from exc
        finally:
            shutil.rmtree(stale, ignore_errors=True)
    raise OSError(f"cannot install the GGUF cache folder {final}: it keeps changing under this process")


def main(argv: list[str] | None = None) -> int:
    """``python -m spec_backend.runtime.gguf_cache MODEL``: print the materialized folder of MODEL
    (``smollm2``, a ``.gguf`` file, or a folder holding one GGUF file)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m spec_backend.runtime.gguf_cache MODEL", file=sys.stderr)
        return 2
    source = resolve_model(args[0])
    if source.gguf_file is None:
        print(f"{source.display} is not a GGUF model; it loads as it is", file=sys.stderr)
        return 2
    print(materialize(source.directory, source.gguf_file))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
