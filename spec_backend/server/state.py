"""The state the routes share (``Server``: the engine, the served model name, the metrics registry, the
tokenizer's characters-per-token bound) and ``ApiError``, the error every route raises for a response
in the OpenAI error shape."""

from __future__ import annotations

import asyncio
import time
from dataclasses import fields
from typing import Any

from fastapi import Request

from spec_backend.engine.inputs import check_token_ids
from spec_backend.engine.params import RequestOutput, SamplingParams
from spec_backend.server.logprobs import TokenTexts
from spec_backend.server.loop import AsyncEngine, Event
from spec_backend.server.protocol import _Sampling
from spec_backend.server.structured import GUIDED_FIELDS, StructuredOutputError, structured_of
from spec_backend.server.textbound import chars_per_token_bound, too_long_for

_DISCONNECT_POLL_S = 0.5

#: Request fields passed to ``SamplingParams`` under the same names (every one both know; the token
#: limit and the logprobs settings are passed on their own).
_SAMPLING_FIELDS = ({f.name for f in fields(SamplingParams)} & set(_Sampling.model_fields)) - {
    "max_tokens",
    "structured_outputs",
}


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
        guided = {name: getattr(body, name) for name in GUIDED_FIELDS if getattr(body, name) is not None}
        try:
            structured, source = structured_of(body.response_format, guided, body.structured_outputs)
        except StructuredOutputError as exc:
            raise ApiError(400, str(exc), param=exc.param) from exc
        try:
            fields = body.model_dump(include=_SAMPLING_FIELDS)
            limit = max_tokens if max_tokens is not None else self.engine.llm.max_model_len
            return SamplingParams(**fields, max_tokens=limit, structured_outputs=structured, **extra)
        except ValueError as exc:  # ignore_eos with a constraint names the constraint's field
            param = source if source is not None and "structured_outputs" in str(exc) else None
            raise ApiError(400, str(exc), param=param) from exc

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
        self, prompts: list[list[int]], params: SamplingParams, cache_salt: str | None = None
    ) -> list[tuple[str, asyncio.Queue[Event]]]:
        """Queue every prompt's ``n`` samples, or nothing (``SamplingParams.n`` consecutive per prompt);
        ``cache_salt``: the prefix-cache salt of every prompt (``engine/inputs.py``)."""
        queued: list[Any] = list(prompts)
        if cache_salt is not None:
            queued = [{"prompt_token_ids": p, "cache_salt": cache_salt} for p in prompts]
        try:
            return self.engine.submit(queued, params)
        except ValueError as exc:  # a bad prompt, or a constraint that does not compile for this tokenizer
            param = "structured_outputs" if str(exc).startswith("structured_outputs") else "prompt"
            raise ApiError(400, str(exc), param=param) from exc
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


__all__ = ["ApiError", "Server"]
