"""Loading the target model: a local Hugging Face folder, a GGUF file, or the bundled SmolLM2.

Every failure here raises ``ModelLoadError`` with a message naming the path and what to do, before any
generation work starts. Weights load from safetensors or GGUF only: pickled checkpoints (``*.bin``,
``*.pt``, ...) are refused, since unpickling can run arbitrary code; a folder whose safetensors do not
parse, lack weights the model needs, or store floating-point weights as integers is refused too
(``runtime.checkpoint_files``), never filled in at random or cast. The backend's attention function is
registered in transformers' ``AttentionInterface`` under the backend's name, with mask building disabled
for it (``AttentionMaskInterface`` entry that returns ``None``): the ragged attention builds its own
masks from ``RaggedAttentionMetadata``.

A GGUF file is parsed and de-quantized once: the weights and tokenizer then load from its safetensors
copy in the user's cache (``spec_backend.runtime.gguf_cache``; seconds instead of ~20 s for the bundled
model). If the cache cannot be written, the GGUF loads directly, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from spec_backend.backends.base import Backend
from spec_backend.backends.recurrence import RecurrenceOps
from spec_backend.runtime.architectures import check_architecture
from spec_backend.runtime.checkpoint_files import (
    ModelLoadError as ModelLoadError,  # defined there, raised and re-exported here
)
from spec_backend.runtime.checkpoint_files import (
    gguf_architecture,
    read_json_config,
    read_safetensors_dtypes,
    refuse_integer_weights,
)
from spec_backend.runtime.mixers import install_mixers
from spec_backend.runtime.sources import ModelSource

logger = logging.getLogger("spec_backend.engine")

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


#: File names of pickled PyTorch checkpoints: loading one can run arbitrary code, so none is ever loaded.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def refuse_pickles(source: ModelSource) -> None:
    """``ModelLoadError`` when a folder's weights exist only as pickles (``*.bin``, ``*.pt``, ...).

    Weights load from safetensors or GGUF only; the message names the file and how to convert it.
    """
    if source.gguf_file is not None:
        return
    folder = Path(source.directory)
    if any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise ModelLoadError(
            f"model folder {str(folder)!r} holds its weights as pickled PyTorch checkpoint(s) {pickles[:4]} "
            "and no *.safetensors; pickles can run code when loaded, so spec-backend loads safetensors "
            "or GGUF only. Convert once, with transformers, where you trust the file: "
            "AutoModelForCausalLM.from_pretrained(folder).save_pretrained(new_folder) "
            "(writes model.safetensors), then pass new_folder"
        )


def check_gguf_architecture(source: ModelSource) -> None:
    """Fail early when transformers' GGUF loader does not support the file's architecture."""
    if source.gguf_file is None:
        return
    try:
        from gguf import GGUFReader
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError as exc:  # pragma: no cover - gguf is an engine dependency
        raise ModelLoadError(f"loading {source.display} needs the 'gguf' package: {exc}") from exc
    try:
        arch = gguf_architecture(GGUFReader(source.display))
    except Exception as exc:
        raise ModelLoadError(
            f"{source.display} is not a readable GGUF file: {type(exc).__name__}: {exc}"
        ) from exc
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} of {source.display} is not supported by transformers' GGUF loader; "
            f"supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}"
        )


def loadable(source: ModelSource) -> ModelSource:
    """Where the weights and tokenizer load from: a GGUF's cached safetensors copy (written on first
    use, rebuilt when damaged or converted from another file), or ``source`` itself for folders and when
    the cache cannot be written."""
    if source.gguf_file is None:
        return source
    from spec_backend.runtime.gguf_cache import is_materialized, materialize, materialized_path

    cached = materialized_path(source.display)
    if is_materialized(cached, source.display):
        return ModelSource(str(cached))  # converted before: no GGUF parsing at all (~6 s each)
    check_gguf_architecture(source)  # an unsupported file fails before any conversion work
    try:
        return ModelSource(materialize(source.directory, source.gguf_file))
    except ModelLoadError:
        raise  # a damaged cache folder that cannot be replaced: the message says which to delete
    except OSError as exc:
        logger.warning(
            "spec_backend: cannot cache %s as safetensors (%s); loading the GGUF", source.display, exc
        )
        return source
    except Exception as exc:  # transformers' GGUF reader raises library-specific errors
        raise ModelLoadError(f"cannot load model {source.display}: {type(exc).__name__}: {exc}") from exc


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """Mask builder for the ragged attention: none, the attention function builds its own."""
    return None


def register_attention(backend: Backend) -> str:
    """Register ``backend``'s attention in transformers under the backend name; return that name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(backend.name, backend.attention_function())
    AttentionMaskInterface.register(backend.name, _no_mask)
    return backend.name


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype | None:
    """``"auto"`` → ``None`` (decided after loading); names and torch dtypes map to a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return None
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


#: Checkpoints whose ``model_type`` needs remote code although their decoder is an architecture
#: transformers has (vLLM loads them the same way): ``model_type`` -> the in-library ``model_type``.
#: Their extra tensors (MiMo's ``model.mtp_layers.*``) are read by ``method="mtp"``, not by the target.
IN_LIBRARY_TWINS = {"mimo": "qwen2"}


def twin_config(directory: str) -> Any | None:
    """The in-library config for a checkpoint listed in ``IN_LIBRARY_TWINS``, else ``None``."""
    raw = read_json_config(directory, "model folder")
    twin = IN_LIBRARY_TWINS.get(str(raw.get("model_type"))) if raw is not None else None
    if raw is None or twin is None:
        return None
    from transformers import AutoConfig

    settings = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "auto_map")}
    logger.info("spec_backend: loading %s model %s as %s", raw["model_type"], directory, twin)
    return AutoConfig.for_model(twin, **settings)


#: The dtype a model runs in, decided from the dtype its weights loaded in (``Backend.default_dtype``).
DtypeRule = Callable[[torch.dtype], torch.dtype]


def load_model(
    source: ModelSource,
    attn_name: str,
    dtype: torch.dtype | DtypeRule | None,
    device: torch.device,
    recurrence: RecurrenceOps | None = None,
) -> Any:
    """Load the causal LM on ``device`` with the ragged attention, in ``dtype``: a dtype, a rule applied to
    the dtype the weights loaded in (``dtype="auto"`` on the engine: the backend's ``default_dtype``), or
    ``None`` for the loaded dtype itself. ``recurrence``: the backend's recurrences for linear-attention
    layers (a target model, ``runtime.mixers``); ``None`` refuses models that have them (a draft model)."""
    shown, source = source.display, loadable(source)
    refuse_pickles(source)
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"attn_implementation": attn_name, "output_loading_info": True}
    stored: dict[str, str] | None = None  # tensor name -> safetensors dtype, for folders
    if source.gguf_file is not None:
        kwargs["gguf_file"] = source.gguf_file
    else:
        kwargs["use_safetensors"] = True  # never fall back to a pickle
        config = twin_config(source.directory)
        if config is not None:
            kwargs["config"] = config
        stored = read_safetensors_dtypes(source.directory, "model folder")  # a damaged file, named
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(source.directory, **kwargs)
    except Exception as exc:  # corrupt weights raise library-specific errors (SafetensorError, ...)
        raise ModelLoadError(f"cannot load model {shown}: {type(exc).__name__}: {exc}") from exc
    model, info = loaded  # output_loading_info: (model, {"missing_keys": ..., ...})
    if stored is not None:
        check_weights(shown, model, info, stored)
    # recurrent state, chunked attention, ...: refused with the reason
    check_architecture(model, shown, recurrent=recurrence is not None)
    if not isinstance(dtype, torch.dtype):
        dtype = model.dtype if dtype is None else dtype(model.dtype)
    model = model.to(device=device, dtype=dtype)
    if recurrence is not None:
        install_mixers(model, recurrence)
    model.eval()
    return model


def check_weights(shown: str, model: Any, info: dict[str, Any], stored: dict[str, str]) -> None:
    """``ModelLoadError`` when a folder's weights do not cover ``model`` (transformers would fill the
    missing tensors at random; weights tied to others, such as a tied LM head, are not missing) or store
    floating-point weights as integers (``checkpoint_files`` glossary)."""
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelLoadError(
            f"model folder {shown!r} lacks {len(missing)} weight(s) the model needs: {missing[:6]}"
            f"{' ...' if len(missing) > 6 else ''}; transformers would fill them at random. Use a complete "
            "checkpoint (save_pretrained writes every weight)"
        )
    floating = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    refuse_integer_weights("model folder", shown, stored, floating)


#: Files a saved tokenizer consists of (one is enough); a folder with none of them has no tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def load_tokenizer(source: ModelSource) -> Any | None:
    """The model's tokenizer, or ``None`` when the folder has none (token-id prompts still work).

    A folder without tokenizer files has none: transformers would otherwise build a default tokenizer for
    the model type (Gemma's, with ``<eos>`` = 1), whose EOS would end generations the model never ended.
    """
    from transformers import AutoTokenizer

    source = loadable(source)
    kwargs: dict[str, Any] = {}
    if source.gguf_file is not None:
        kwargs["gguf_file"] = source.gguf_file
    elif not any((Path(source.directory) / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        return AutoTokenizer.from_pretrained(source.directory, **kwargs)
    except (OSError, ValueError, KeyError, TypeError):
        return None
