"""``spec-backend serve MODEL``: the OpenAI-compatible server, with ``vllm serve``'s engine flags.

The listening address is checked and bound before the model loads (a bad ``--port`` or ``--host`` is
one ``error: ...`` line and exit status 2 at once, not a traceback after minutes of loading); uvicorn
then serves on that very socket.
"""

from __future__ import annotations

import argparse
import socket
import threading
from typing import Any

from spec_backend.server.defaults import DEFAULT_MAX_BODY_BYTES


def add_serve_parser(sub: Any) -> None:
    from spec_backend.tools.cli import add_engine_args

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    add_engine_args(p, positional_model=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="1..65535 (default: 8000)")
    p.add_argument("--served-model-name", default=None, help="the model name clients send (default: MODEL)")
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest request body accepted; bigger ones get 413 (default: {DEFAULT_MAX_BODY_BYTES})",
    )
    p.add_argument("--uvicorn-log-level", default="info")
    p.set_defaults(func=cmd_serve)


class AddressError(Exception):
    """The listening address cannot be used (the message names the value)."""


def bind_listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (as uvicorn binds: IPv6 when the host has a colon,
    ``SO_REUSEADDR``), or ``AddressError`` naming what is wrong."""
    if not 1 <= port <= 65535:
        raise AddressError(f"--port must be in 1..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        raise AddressError(f"cannot listen on --host {host!r} --port {port}: {exc}") from None
    sock.set_inheritable(True)
    return sock


def cmd_serve(args: argparse.Namespace) -> int:
    """Check and bind the address, load the model, then serve until SIGINT/SIGTERM (in-flight
    requests finish or fail explicitly)."""
    import uvicorn  # a missing serve extra is reported by spec_backend.cli.main
    from prometheus_client import CollectorRegistry

    from spec_backend.server.app import build_app
    from spec_backend.server.loop import AsyncEngine
    from spec_backend.server.state import Server
    from spec_backend.tools.cli import build_llm
    from spec_backend.tools.errors import CliError, fail

    if args.max_body_bytes < 1:
        return fail(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    try:
        sock = bind_listen_socket(args.host, args.port)
    except AddressError as exc:
        return fail(exc)
    registry = CollectorRegistry()
    try:
        llm = build_llm(args, metrics_registry=registry)
    except CliError as exc:
        sock.close()
        return fail(exc)
    engine = AsyncEngine(llm)
    server = Server(engine, args.served_model_name or args.model, registry)
    config = uvicorn.Config(
        build_app(server, max_body_bytes=args.max_body_bytes),
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=30,
    )

    class _Uvicorn(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Fail what is in flight first, explicitly (each stream gets an error event and [DONE]),
            # so open responses end and uvicorn's graceful shutdown does not wait on them.
            threading.Thread(target=engine.stop, name="spec-backend-stop", daemon=True).start()
            super().handle_exit(sig, frame)

    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"serving {server.model_name!r} on http://{shown}:{args.port}", flush=True)
    _Uvicorn(config).run(sockets=[sock])
    return 0
