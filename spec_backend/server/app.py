"""The FastAPI application over an ``AsyncEngine``: shared state (``Server``), errors, and the small
routes (``/health``, ``/v1/models``, ``/metrics``); the completion routes are in ``routes``.

Responses follow the OpenAI API's shapes; every error, the framework's own included (an undecodable
body, an unknown route), is ``{"error": {"message", "type", "param", "code"}}`` with status 400 (bad
request), 404 (unknown model or route), 413 (body over the cap), 500 (generation failed) or 503 (the
server is shutting down).

Nothing slow runs on the event loop: bodies are capped (``limits``), text is measured against
``max_model_len`` before it is tokenized (``textbound``), and chat templates, tokenization and the
prompt checks run on worker threads, so one huge request cannot hold up ``/health`` or other clients.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import fields
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from spec_backend.engine.inputs import check_token_ids
from spec_backend.engine.params import RequestOutput, SamplingParams
from spec_backend.server.limits import DEFAULT_MAX_BODY_BYTES, BodyLimit
from spec_backend.server.logprobs import TokenTexts
from spec_backend.server.loop import AsyncEngine, Event
from spec_backend.server.protocol import _Sampling, error_body
from spec_backend.server.textbound import chars_per_token_bound, too_long_for

_DISCONNECT_POLL_S = 0.5
_KINDS = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
}

#: Request fields passed to ``SamplingParams`` under the same names (every one both know; the token
#: limit and the logprobs settings are passed on their own).
_SAMPLING_FIELDS = ({f.name for f in fields(SamplingParams)} & set(_Sampling.model_fields)) - {"max_tokens"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


class Server:
    """State shared by the routes: the engine, the served model name, the metrics registry, and the
    tokenizer's characters-per-token bound (``textbound``)."""

    def __init__(self, engine: AsyncEngine, model_name: str, registry: Any) -> None:
        self.engine, self.model_name, self.registry = engine, model_name, registry
        self.created = int(time.time())
        self.chars_per_token = chars_per_token_bound(engine.llm.tokenizer)
        self.texts = TokenTexts(engine.llm.tokenizer)

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(
                404,
                f"model {name!r} does not exist; this server serves {self.model_name!r}",
                "NotFoundError",
                "model",
            )

    def params(self, body: _Sampling, max_tokens: int | None, **extra: Any) -> SamplingParams:
        try:
            fields = body.model_dump(include=_SAMPLING_FIELDS)
            limit = max_tokens if max_tokens is not None else self.engine.llm.max_model_len
            return SamplingParams(**fields, max_tokens=limit, **extra)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc

    async def tokenize(self, prompts: list[str | list[int]]) -> list[list[int]]:
        """Token ids of every prompt, as offline ``generate`` tokenizes and checks them, on a worker
        thread; text that cannot fit ``max_model_len`` is refused first, without tokenizing it."""
        llm = self.engine.llm
        for i, prompt in enumerate(prompts):
            why = isinstance(prompt, str) and too_long_for(prompt, llm.max_model_len, self.chars_per_token)
            if why:
                raise ApiError(400, f"prompt {i} {why}", param="prompt")

        def run() -> list[list[int]]:
            out = []
            for i, prompt in enumerate(prompts):
                ids = prompt if isinstance(prompt, list) else llm._tokenize(prompt, None, i)
                check_token_ids(ids, i, llm.engine.runner.vocab_size, llm.max_model_len)
                out.append(ids)
            return out

        try:
            return await asyncio.to_thread(run)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="prompt") from exc

    async def chat_text(self, conversation: list[dict[str, str]]) -> str:
        """``conversation`` through the chat template, on a worker thread."""
        from jinja2 import TemplateError

        llm = self.engine.llm
        if not llm.has_chat_template():
            raise ApiError(400, f"model {self.model_name!r} has no chat template; use /v1/completions")
        try:
            return str(await asyncio.to_thread(llm.chat_text, conversation))
        except TemplateError as exc:
            raise ApiError(400, f"the chat template refused the messages: {exc}", param="messages") from exc

    def submit(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[tuple[str, asyncio.Queue[Event]]]:
        """Queue every prompt's ``n`` samples, or nothing (``SamplingParams.n`` consecutive per prompt)."""
        try:
            return self.engine.submit(list(prompts), params)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="prompt") from exc
        except RuntimeError as exc:
            raise ApiError(503, str(exc), "ServiceUnavailableError") from exc

    async def final(self, request_id: str, events: asyncio.Queue[Event], http: Request) -> RequestOutput:
        """Wait for the request's last event; abort it if the client goes away first."""
        while True:
            try:
                event = await asyncio.wait_for(events.get(), _DISCONNECT_POLL_S)
            except TimeoutError:
                if await http.is_disconnected():
                    self.engine.abort(request_id)
                    raise ApiError(499, "client disconnected") from None
                continue
            if event.output is not None:
                return event.output


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.status, exc.kind, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse(
            error_body(f"invalid request: {problems}", 400, "BadRequestError"), status_code=400
        )

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
    from spec_backend.server.routes import install_routes

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
