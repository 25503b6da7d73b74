"""A GGUF model de-quantized once into a safetensors folder under the user's cache directory.

Parsing and de-quantizing a GGUF file with transformers takes tens of seconds (the bundled SmolLM2:
~20 s); reading the same weights from safetensors takes about a second. ``materialize`` does the slow
part once and keeps the result, keyed by the SHA-256 of the GGUF file, so a changed file never reuses a
stale folder.

Glossary:

* **cache root** — ``$SPEC_BACKEND_CACHE`` when set, else ``$XDG_CACHE_HOME/spec_backend``, else
  ``~/.cache/spec_backend``.
* **materialized folder** — ``<cache root>/gguf/<stem>-<sha256[:16]>/``: ``config.json`` (without the
  GGUF ``quantization_config``), ``model.safetensors`` (float32), the tokenizer files and the chat
  template. A plain Hugging Face folder: vLLM, transformers and this engine all load it.

Concurrent first runs are safe: each writes into its own temporary folder beside the final one and
renames it into place; the loser of the race discards its copy and uses the winner's.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger("spec_backend.engine")

CACHE_ENV = "SPEC_BACKEND_CACHE"
_WEIGHTS = "model.safetensors"


def cache_root() -> Path:
    """Where spec_backend keeps derived files (see the module glossary)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "spec_backend"


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


def materialized_path(gguf_path: str | os.PathLike[str]) -> Path:
    """The folder ``materialize`` writes for this GGUF file (it may not exist yet)."""
    path = Path(gguf_path)
    stat = path.stat()
    digest = _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    return cache_root() / "gguf" / f"{path.stem}-{digest[:16]}"


def is_materialized(folder: Path) -> bool:
    """Whether ``folder`` (a ``materialized_path``) holds a finished conversion."""
    return (folder / _WEIGHTS).is_file()


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
    """The safetensors folder for ``directory/gguf_file``, writing it on first use (see module doc)."""
    final = materialized_path(os.path.join(directory, gguf_file))
    if is_materialized(final):
        return str(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    logger.info("spec_backend: de-quantizing %s once into %s", gguf_file, final)
    partial = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
    try:
        _write_folder(directory, gguf_file, partial)
        try:
            os.rename(partial, final)  # atomic; fails when another process got there first
        except OSError:
            if not is_materialized(final):
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return str(final)


def main(argv: list[str] | None = None) -> int:
    """``python -m spec_backend.engine.gguf_cache MODEL``: print the materialized folder of MODEL
    (``smollm2``, a ``.gguf`` file, or a folder holding one GGUF file)."""
    from spec_backend.engine.loader import resolve_model

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m spec_backend.engine.gguf_cache MODEL", file=sys.stderr)
        return 2
    source = resolve_model(args[0])
    if source.gguf_file is None:
        print(f"{source.display} is not a GGUF model; it loads as it is", file=sys.stderr)
        return 2
    print(materialize(source.directory, source.gguf_file))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
