"""``spec-backend train-eagle3``'s checks of its arguments, made before any work (no weights loaded).

Each check raises ``ValueError`` with one sentence that names the flag, the value received and what is
allowed; the command prints it as one ``error: ...`` line and exits with status 2. The target's depth and
vocabulary come from its config alone (``target_sizes``), so a refused run loads no model and writes no
folder.
"""

from __future__ import annotations

import argparse
import functools
import math
import os

#: Flags of one pipeline only (``dest`` names): given to the other one they would be ignored.
FILE_ONLY = ("work", "sequences", "bf16", "init_from_target", "init_head")
ONLINE_ONLY = ("device", "variants", "samples", "batch", "gen_batch", "answers", "budget", "answer_share",
               "qat_int4", "families", "self_prompts")  # fmt: skip

#: The least value of each integer flag.
INT_MINIMUMS = {"sequences": 0, "max_len": 1, "draft_vocab": 1, "ttt": 1, "epochs": 1, "chats": 0,
                "chat_tokens": 1, "variants": 1, "samples": 0, "batch": 1, "gen_batch": 1,
                "self_prompts": 0}  # fmt: skip


def flag(dest: str) -> str:
    """The command-line spelling of an argument's ``dest`` (``draft_vocab`` -> ``--draft-vocab``)."""
    return "--" + dest.replace("_", "-")


def target_sizes(target: str) -> tuple[int, int]:
    """(decoder layers, vocabulary size) of the target, from its config alone (no weights read)."""
    from spec_backend.runtime.sources import resolve_model

    source = resolve_model(target)  # ModelLoadError (a ValueError) names what is wrong with it
    config = os.path.join(source.directory, source.gguf_file or "config.json")
    return _sizes(source.directory, source.gguf_file, os.stat(config).st_mtime_ns)


@functools.cache
def _sizes(directory: str, gguf_file: str | None, mtime_ns: int) -> tuple[int, int]:
    """``target_sizes`` once per version of a config (the CLI's check and the run both ask; a GGUF's
    config takes seconds to parse)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(directory, gguf_file=gguf_file)
        text = config.get_text_config()
        return int(text.num_hidden_layers), int(text.vocab_size)
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        where = os.path.join(directory, gguf_file or "config.json")
        raise ValueError(f"cannot read the target's config {where!r}: {exc}") from exc


def check_target(target: str, draft_vocab: int) -> None:
    """The target exists, is deep enough for EAGLE-3's auxiliary layers and has at least ``draft_vocab``
    tokens."""
    from spec_backend.models.eagle3 import default_aux_layer_ids

    layers, vocab = target_sizes(target)
    aux = default_aux_layer_ids(layers)
    if any(not 0 <= i <= layers for i in aux):
        raise ValueError(
            f"--target {target!r} has {layers} decoder layers, too few for an EAGLE-3 head: it reads the "
            f"target's layers (2, L//2, L-3) = {aux}, which must lie in 0..{layers}, so the target needs "
            "at least 3 layers (no flag sets the layers)"
        )
    if draft_vocab > vocab:
        raise ValueError(
            f"--draft-vocab must be at most the target's vocabulary size {vocab}, got {draft_vocab}"
        )


def families_of(text: str) -> tuple[str, ...]:
    """The prompt families of ``--families`` (comma-separated names)."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def check_numbers(args: argparse.Namespace) -> None:
    """Counts at their least value or above, a positive finite learning rate, a finite budget."""
    for dest, least in INT_MINIMUMS.items():
        if getattr(args, dest) < least:
            raise ValueError(f"{flag(dest)} must be at least {least}, got {getattr(args, dest)}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ValueError(f"--lr must be a finite number above 0, got {args.lr}")
    if not (math.isfinite(args.budget) and args.budget >= 0):
        raise ValueError(f"--budget must be a finite number of seconds, 0 or more, got {args.budget}")
    if not 0 < args.answer_share <= 1:
        raise ValueError(f"--answer-share must be in (0, 1], got {args.answer_share}")
    from spec_backend_train.prompts import FAMILIES

    families = families_of(args.families)
    if not families or set(families) - set(FAMILIES):
        raise ValueError(f"--families must name some of {', '.join(FAMILIES)}, got {args.families!r}")


def check_mode(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """No flag of the other pipeline is given (it would be ignored), and the file pipeline has ``--work``."""
    others, mode = (FILE_ONLY, "with --online") if args.online else (ONLINE_ONLY, "without --online")
    given = [flag(d) for d in others if getattr(args, d) != parser.get_default(d)]
    if given:
        raise ValueError(f"{', '.join(given)} cannot be used {mode}: the run would ignore them")
    if not args.online and args.work is None:
        raise ValueError("train-eagle3 needs --work (the folder for extracted states), or --online")


def check_folder(name: str, path: str) -> None:
    """``path`` is a folder, or one that can be made: its nearest existing ancestor is a writable
    folder (nothing is created here)."""
    full = os.path.abspath(path)
    if os.path.exists(full):
        if not os.path.isdir(full):
            raise ValueError(f"{name} {path!r} is a file, not a folder")
        if not os.access(full, os.W_OK | os.X_OK):
            raise ValueError(f"{name} {path!r} is not writable")
        return
    parent = os.path.dirname(full)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{name} {path!r} cannot be created: {parent!r} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {path!r} cannot be created: {parent!r} is not writable")


def check_paths(args: argparse.Namespace) -> None:
    """The folders the run writes can be made; ``--init-head`` is a saved head; ``--answers`` can be
    written."""
    check_folder("--out", args.out)
    if args.work is not None:
        check_folder("--work", args.work)
    if args.init_head is not None and not os.path.isfile(os.path.join(args.init_head, "model.safetensors")):
        raise ValueError(
            f"--init-head {args.init_head!r} is not a head folder: it has no model.safetensors "
            "(give the --out folder of an earlier train-eagle3 run)"
        )
    if args.answers is not None:
        folder = os.path.dirname(os.path.abspath(args.answers))
        if os.path.isdir(args.answers) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise ValueError(f"--answers {args.answers!r} cannot be written: it must name a file in an "
                             "existing, writable folder")  # fmt: skip


def check_device(device: str) -> None:
    """``device`` names a device this machine has."""
    import torch

    try:
        where = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"--device {device!r} is not a device: {exc}") from exc
    if where.type == "cpu":
        return
    backend = torch.backends.mps if where.type == "mps" else getattr(torch, where.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise ValueError(f"--device {device!r}: no {where.type} device is available on this machine")
    count = getattr(backend, "device_count", None)
    if where.index is not None and count is not None and where.index >= count():
        raise ValueError(f"--device {device!r}: this machine has {count()} {where.type} device(s)")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every check above, cheapest first; raises ``ValueError`` at the first problem."""
    check_mode(parser, args)
    check_numbers(args)
    if not args.online:
        from spec_backend_train.prompts import instruction_prompts

        available = len(instruction_prompts())
        if args.chats > available:
            raise ValueError(
                f"--chats must be in [0, {available}] "
                f"(the instruction prompts of spec_backend_train.prompts), got {args.chats}"
            )
    check_paths(args)
    if args.online:
        check_device(args.device)
    check_target(args.target, args.draft_vocab)


__all__ = ["check_arguments", "check_target", "families_of", "target_sizes"]
