"""The ``spec-backend`` command: ``backends`` here; ``generate``, ``bench`` and ``demo`` from the engine,
``serve`` from the server, and the commands of installed plugins (``COMMAND_GROUP``).

Glossary:
    command plugin: an entry point of the ``spec_backend.commands`` group, named as the subcommand it
        adds; its object is a function ``add(subparsers)`` that adds that subcommand (and imports no
        torch: ``spec-backend --help`` loads every plugin). ``spec-backend-train`` registers
        ``train-eagle3`` this way.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

#: The entry-point group of command plugins (module docstring).
COMMAND_GROUP = "spec_backend.commands"


class CommandPluginError(RuntimeError):
    """A command plugin that fails to import, or whose command clashes with a command already there."""


def _limit(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


def cmd_backends(args: argparse.Namespace) -> int:
    """Print every installed backend: availability and reason, device and token limits, then what each adds
    to its ``describe()`` summary."""
    from spec_backend.backends import list_backends
    from spec_backend.backends.base import Availability

    rows = [("backend", "device", "status", "max query tokens/request", "max spec tokens")]
    infos = list_backends()
    for info in infos:
        limits = info.backend.token_limits()
        status = str(Availability(info.available, info.reason))
        rows.append(
            (
                info.name,
                info.device_type,
                status,
                _limit(limits.max_query_tokens_per_request),
                str(limits.max_speculative_tokens),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    shown = {"name", "device", "status", "max_query_tokens_per_request", "max_speculative_tokens"}
    for info in infos:  # what a backend adds to its summary (the cpu one: ISA variants, fast path)
        extra = {k: v for k, v in info.backend.describe().items() if k not in shown}
        if extra:
            print(f"\n{info.name}:")
        for key, value in extra.items():
            print(f"  {key}: {value}")
    return 0


def _add_engine_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Engine subcommands live with the engine; they are skipped only if the engine is not built."""
    try:
        engine_cli = importlib.import_module("spec_backend.tools.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("spec_backend.engine", "spec_backend.tools.cli"):
            raise
        return
    for hook in ("add_generate_parser", "add_bench_parser", "add_demo_parser"):
        add = getattr(engine_cli, hook, None)
        if add is not None:
            add(sub)


def _command_entry_points() -> list[importlib.metadata.EntryPoint]:
    """The installed command plugins, by name then distribution (a stable order for the clash check)."""
    eps = importlib.metadata.entry_points(group=COMMAND_GROUP)
    return sorted(eps, key=lambda ep: (ep.name, _origin(ep)))


def _origin(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"distribution {dist.name}" if dist is not None else "an unnamed distribution"


def _add_plugin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add each command plugin's subcommand. A plugin that fails to import is raised with its name; a
    plugin whose name is already a command, or that adds any other command, is refused."""
    origins = dict.fromkeys(sub.choices, "spec-backend itself")
    for ep in _command_entry_points():
        where = f"command plugin {ep.name!r} ({ep.value}, from {_origin(ep)})"
        if ep.name in origins:
            raise CommandPluginError(
                f"{where} is refused: the command {ep.name!r} already exists (from {origins[ep.name]}); "
                "uninstall one of the two"
            )
        try:
            add = ep.load()
        except Exception as exc:
            raise CommandPluginError(f"{where} failed to import: {type(exc).__name__}: {exc}") from exc
        before = dict(sub.choices)
        try:
            add(sub)
        except Exception as exc:  # argparse's "conflicting subparser" among them
            raise CommandPluginError(
                f"{where} failed to add its command: {type(exc).__name__}: {exc}"
            ) from exc
        added = {name for name, parser in sub.choices.items() if before.get(name) is not parser}
        if added != {ep.name}:
            raise CommandPluginError(
                f"{where} must add exactly the command {ep.name!r}, it added {sorted(added)}"
            )
        origins[ep.name] = _origin(ep)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spec-backend", description="Speculative decoding on CUDA, Ascend and CPU"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    backends = sub.add_parser("backends", help="list installed backends, their availability and token limits")
    backends.set_defaults(func=cmd_backends)
    _add_engine_commands(sub)
    from spec_backend.server.cli import add_serve_parser

    add_serve_parser(sub)
    _add_plugin_commands(sub)
    return parser


#: Modules of the optional extras (pyproject's ``[project.optional-dependencies]``) -> the extra.
EXTRA_OF_MODULE = {
    **dict.fromkeys(("transformers", "gguf", "accelerate", "prometheus_client", "tqdm"), "engine"),
    **dict.fromkeys(("fastapi", "uvicorn", "starlette"), "serve"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        extra = EXTRA_OF_MODULE.get(missing)
        if extra is None:
            raise
        print(
            f"spec-backend {args.command}: needs the {extra} extra (module {missing!r} is not installed). "
            f"Install it from a checkout of spec-backend: pip install '.[{extra}]'",
            file=sys.stderr,
        )
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
