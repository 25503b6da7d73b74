"""The ``spec-backend`` command: ``backends`` here; ``generate``, ``bench`` and ``demo`` from the engine."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence


def _limit(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


def cmd_backends(args: argparse.Namespace) -> int:
    """Print every installed backend: availability and reason, device and token limits."""
    from spec_backend.backends import list_backends
    from spec_backend.backends.base import Availability

    rows = [("backend", "device", "status", "max query tokens/request", "max spec tokens")]
    for info in list_backends():
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
    return 0


def _add_engine_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Engine subcommands live with the engine; they are skipped only if the engine is not built."""
    try:
        engine_cli = importlib.import_module("spec_backend.engine.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("spec_backend.engine", "spec_backend.engine.cli"):
            raise
        return
    for hook in ("add_generate_parser", "add_bench_parser", "add_demo_parser"):
        add = getattr(engine_cli, hook, None)
        if add is not None:
            add(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spec-backend", description="Speculative decoding on CUDA, Ascend and CPU"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    backends = sub.add_parser("backends", help="list installed backends, their availability and token limits")
    backends.set_defaults(func=cmd_backends)
    _add_engine_commands(sub)
    from spec_backend.server.cli import add_serve_parser
    from spec_backend.training.pipeline import add_parser as add_train_parser

    add_serve_parser(sub)
    add_train_parser(sub)
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
