"""``spec-backend serve MODEL``: the OpenAI-compatible server, with ``vllm serve``'s engine flags."""

from __future__ import annotations

import argparse
import threading
from typing import Any


def add_serve_parser(sub: Any) -> None:
    from spec_backend.engine.cli import add_engine_args

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    add_engine_args(p, positional_model=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the model name clients send (default: MODEL)")
    p.add_argument("--uvicorn-log-level", default="info")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Load the model, then serve until SIGINT/SIGTERM (in-flight requests finish or fail explicitly)."""
    import uvicorn  # a missing serve extra is reported by spec_backend.cli.main
    from prometheus_client import CollectorRegistry

    from spec_backend.engine.cli import CliError, build_llm, fail
    from spec_backend.server.app import Server, build_app
    from spec_backend.server.loop import AsyncEngine

    registry = CollectorRegistry()
    try:
        llm = build_llm(args, metrics_registry=registry)
    except CliError as exc:
        return fail(exc)
    engine = AsyncEngine(llm)
    server = Server(engine, args.served_model_name or args.model, registry)
    config = uvicorn.Config(
        build_app(server),
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=30,
    )

    class _Uvicorn(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Fail what is in flight first, explicitly (each stream gets an error event and [DONE]),
            # so open responses end and uvicorn's graceful shutdown does not wait on them.
            threading.Thread(target=engine.stop, name="spec-backend-stop", daemon=True).start()
            super().handle_exit(sig, frame)

    _Uvicorn(config).run()
    return 0
