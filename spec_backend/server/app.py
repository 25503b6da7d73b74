"""The FastAPI application over an ``AsyncEngine``: errors, and the small routes (``/health``,
``/v1/models``, ``/metrics``); the shared state is ``state.Server``, the completion routes are in
``routes``.

Responses follow the OpenAI API's shapes; every error, the framework's own included (an undecodable
body, an unknown route), is ``{"error": {"message", "type", "param", "code"}}`` with status 400 (bad
request), 404 (unknown model or route), 413 (body over the cap), 500 (generation failed) or 503 (the
server is shutting down); a request that fails validation names its first field at fault in ``param``
(``messages.0.content``), as OpenAI does.

Nothing slow runs on the event loop: bodies are capped (``limits``), text is measured against
``max_model_len`` before it is tokenized (``textbound``), and chat templates, tokenization and the
prompt checks run on worker threads, so one huge request cannot hold up ``/health`` or other clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from spec_backend.server.limits import DEFAULT_MAX_BODY_BYTES, BodyLimit
from spec_backend.server.protocol import error_body
from spec_backend.server.routes import install_routes
from spec_backend.server.state import ApiError, Server

_KINDS = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
}


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.status, exc.kind, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields = [".".join(str(p) for p in e["loc"] if p != "body") for e in exc.errors()]
        problems = "; ".join(f"{f or 'body'}: {e['msg']}" for f, e in zip(fields, exc.errors(), strict=True))
        body = error_body(
            f"invalid request: {problems}", 400, "BadRequestError", next(iter(fields), "") or None
        )
        return JSONResponse(body, status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        message = str(exc.detail)
        if isinstance(exc.__cause__, UnicodeDecodeError):
            message = f"invalid request: the body is not UTF-8 JSON ({exc.__cause__})"
        kind = _KINDS.get(exc.status_code, "HTTPError")
        return JSONResponse(error_body(message, exc.status_code, kind), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        message = f"internal error: {type(exc).__name__}: {exc}"
        return JSONResponse(error_body(message, 500, "InternalServerError"), status_code=500)


def build_app(server: Server, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI application; the engine thread runs for the app's lifetime. Bodies over
    ``max_body_bytes`` are refused with 413."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.engine.start()
        yield
        await asyncio.to_thread(server.engine.stop)

    app = FastAPI(title="spec-backend", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    _install_errors(app)
    _install_small_routes(app, server)
    install_routes(app, server)
    return app


def _install_small_routes(app: FastAPI, server: Server) -> None:
    @app.get("/health")
    async def health() -> dict[str, Any]:
        engine = server.engine.llm.engine  # lengths only: a racy read is at worst one step old
        return {
            "status": "ok",
            "num_requests_running": len(engine.running),
            "num_requests_waiting": len(engine.waiting),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": server.model_name,
            "object": "model",
            "created": server.created,
            "owned_by": "spec-backend",
        }
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(server.registry), media_type=CONTENT_TYPE_LATEST)
