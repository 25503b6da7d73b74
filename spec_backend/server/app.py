"""The OpenAI-compatible routes (FastAPI) over an ``AsyncEngine``.

Responses follow the OpenAI API's shapes (``text_completion``, ``chat.completion``, their ``.chunk``
streaming forms as server-sent events ending in ``data: [DONE]``); errors are ``{"error": {...}}`` with
status 400 (bad request), 404 (unknown model) or 500/503 (the engine failed / is shutting down).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import fields
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from spec_backend.engine.params import RequestOutput, SamplingParams
from spec_backend.server.detokenize import IncrementalDetokenizer
from spec_backend.server.loop import AsyncEngine, Event
from spec_backend.server.protocol import ChatCompletionRequest, CompletionRequest, _Sampling, error_body

_DISCONNECT_POLL_S = 0.5


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


class Server:
    """State shared by the routes: the engine, the served model name, the metrics registry."""

    def __init__(self, engine: AsyncEngine, model_name: str, registry: Any) -> None:
        self.engine, self.model_name, self.registry = engine, model_name, registry
        self.created = int(time.time())

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(
                404,
                f"model {name!r} does not exist; this server serves {self.model_name!r}",
                "NotFoundError",
                "model",
            )

    def params(self, body: _Sampling, max_tokens: int | None) -> SamplingParams:
        try:
            fields = body.model_dump(include=_SAMPLING_FIELDS)
            limit = max_tokens if max_tokens is not None else self.engine.llm.max_model_len
            return SamplingParams(**fields, max_tokens=limit)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc

    def submit(
        self, prompts: list[str | list[int]], params: SamplingParams
    ) -> list[tuple[str, asyncio.Queue[Event]]]:
        """Queue every prompt, or none: a bad one aborts those already queued."""
        queued: list[tuple[str, asyncio.Queue[Event]]] = []
        try:
            for prompt in prompts:
                queued.append(self.engine.submit(prompt, params))
        except ValueError as exc:
            for request_id, _ in queued:
                self.engine.abort(request_id)
            raise ApiError(400, str(exc), param="prompt") from exc
        except RuntimeError as exc:
            raise ApiError(503, str(exc), "ServiceUnavailableError") from exc
        return queued

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


#: Request fields passed to ``SamplingParams`` under the same names (every one both know; the token
#: limit comes from ``max_tokens`` or ``max_completion_tokens`` and is passed on its own).
_SAMPLING_FIELDS = ({f.name for f in fields(SamplingParams)} & set(_Sampling.model_fields)) - {"max_tokens"}


def _finish(output: RequestOutput) -> str:
    completion = output.outputs[0]
    if completion.finish_reason == "error":
        raise ApiError(500, f"generation failed: {completion.error}", "InternalServerError")
    return str(completion.finish_reason)


def _usage(outputs: list[RequestOutput]) -> dict[str, int]:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def _deltas(
    server: Server, request_id: str, events: asyncio.Queue[Event], skip_special: bool
) -> AsyncIterator[tuple[str, RequestOutput | None]]:
    """Text deltas of one request as it generates; the last one comes with the final output. The
    request is aborted if the consumer stops early (the client went away)."""
    tokenizer, sent, done = server.engine.llm.tokenizer, "", False
    stream = IncrementalDetokenizer(tokenizer, skip_special) if tokenizer is not None else None
    try:
        while not done:
            event = await events.get()
            done = event.output is not None
            if event.output is not None:  # the final text (stop strings cut) settles what is left
                text = event.output.outputs[0].text
                delta = text[len(sent) :] if text.startswith(sent) else ""
            else:
                delta = stream.step(event.token_ids) if stream is not None else ""
                if not delta:
                    continue
            sent += delta
            yield delta, event.output
    finally:
        if not done:
            server.engine.abort(request_id)


def _chunk(server: Server, kind: str, rid: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": server.model_name,
        "choices": [choice],
    }


async def _stream(
    server: Server, queued: tuple[str, asyncio.Queue[Event]], params: SamplingParams, chat: bool
) -> AsyncIterator[str]:
    request_id, events = queued
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    kind = "chat.completion.chunk" if chat else "text_completion"
    if chat:
        yield _sse(_chunk(server, kind, rid, {"index": 0, "delta": {"role": "assistant", "content": ""}}))
    async for delta, output in _deltas(server, request_id, events, params.skip_special_tokens):
        finish = None
        if output is not None:
            try:
                finish = _finish(output)
            except ApiError as exc:
                yield _sse(error_body(exc.message, exc.status, exc.kind))
                break
        if not delta and finish is None:
            continue
        body = {"content": delta} if chat else None
        choice = {"index": 0, "finish_reason": finish, **({"delta": body} if chat else {"text": delta})}
        if not chat:
            choice["logprobs"] = None
        yield _sse(_chunk(server, kind, rid, choice))
    yield _sse("[DONE]")


def _streaming(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(gen, media_type="text/event-stream")


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


def build_app(server: Server) -> FastAPI:
    """The FastAPI application; the engine thread runs for the app's lifetime."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.engine.start()
        yield
        await asyncio.to_thread(server.engine.stop)

    app = FastAPI(title="spec-backend", lifespan=lifespan)
    _install_errors(app)
    _install_routes(app, server)
    return app


def _install_routes(app: FastAPI, server: Server) -> None:
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

    app.post("/v1/completions", response_model=None)(_completions_route(server))
    app.post("/v1/chat/completions", response_model=None)(_chat_route(server))


def _prompt_list(prompt: str | list[int] | list[str]) -> list[str | list[int]]:
    """One text, one token-id list, or several texts (one choice each)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, str) for p in prompt):
        return [str(p) for p in prompt]
    return [[int(p) for p in prompt]]


def _completions_route(server: Server) -> Callable[..., Any]:
    async def completions(body: CompletionRequest, http: Request) -> Any:
        server.check_model(body.model)
        prompts = _prompt_list(body.prompt)
        if body.stream and len(prompts) != 1:
            raise ApiError(400, f"stream=true takes one prompt, got {len(prompts)}", param="stream")
        params = server.params(body, body.max_tokens or 16)
        queued = server.submit(prompts, params)
        if body.stream:
            return _streaming(_stream(server, queued[0], params, chat=False))
        outputs = list(await asyncio.gather(*(server.final(rid, q, http) for rid, q in queued)))
        choices = [
            {"index": i, "text": o.outputs[0].text, "finish_reason": _finish(o), "logprobs": None}
            for i, o in enumerate(outputs)
        ]
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time())}
        return {**head, "model": server.model_name, "choices": choices, "usage": _usage(outputs)}

    return completions


def _chat_route(server: Server) -> Callable[..., Any]:
    async def chat(body: ChatCompletionRequest, http: Request) -> Any:
        server.check_model(body.model)
        llm = server.engine.llm
        if not llm.has_chat_template():
            raise ApiError(400, f"model {server.model_name!r} has no chat template; use /v1/completions")
        text = llm.chat_text([m.model_dump(exclude_none=True) for m in body.messages])
        params = server.params(body, body.max_completion_tokens or body.max_tokens)
        queued = server.submit([text], params)
        if body.stream:
            return _streaming(_stream(server, queued[0], params, chat=True))
        output = await server.final(*queued[0], http)
        message = {"role": "assistant", "content": output.outputs[0].text}
        choice = {"index": 0, "message": message, "finish_reason": _finish(output), "logprobs": None}
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
        }
        return {**head, "model": server.model_name, "choices": [choice], "usage": _usage([output])}

    return chat
