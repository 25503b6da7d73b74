"""``/v1/completions`` and ``/v1/chat/completions``, streaming (server-sent events ending in
``data: [DONE]``) or not, with ``n`` samples per prompt and logprobs in OpenAI's shapes.

Choice ``i * n + j`` is sample ``j`` of prompt ``i``; the samples of a seeded request use ``seed + j``,
as offline ``generate`` with ``SamplingParams(n=...)`` does, so they equal its ``outputs[j]``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from spec_backend.engine.params import Logprob, RequestOutput
from spec_backend.server.logprobs import CompletionLogprobs, chat_logprobs
from spec_backend.server.protocol import ChatCompletionRequest, CompletionRequest, error_body
from spec_backend.server.state import ApiError, Server
from spec_backend.server.streaming import Queued, Step, stream


def _finish(output: RequestOutput) -> str:
    completion = output.outputs[0]
    if completion.finish_reason == "error":
        raise ApiError(500, f"generation failed: {completion.error}", "InternalServerError")
    return str(completion.finish_reason)


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens``: prompt tokens the prefix cache served."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _head(kind: str, prefix: str, server: Server) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": server.model_name,
    }


def _streaming(
    server: Server, queued: list[Queued], skip: bool, chat: bool, choice: Any, usage: Any = None
) -> StreamingResponse:
    events = stream(server, queued, skip, chat, choice, usage)
    return StreamingResponse(events, media_type="text/event-stream")


def _include_usage(body: CompletionRequest | ChatCompletionRequest) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


def _usage_of(
    prompts: list[list[int]], n: int, outputs: list[RequestOutput], generated: int | None = None
) -> dict[str, Any]:
    """The usage of ``prompts`` (each sampled ``n`` times) from their final outputs, in choice order:
    each prompt counted once, its cached tokens from its first sample; ``generated`` overrides the
    completion tokens counted from the outputs."""
    if generated is None:
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    cached = sum(o.num_cached_tokens for o in outputs[::n])
    return _usage(sum(len(p) for p in prompts), generated, cached)


def _step_finish(step: Step) -> tuple[str | None, dict[str, Any] | None]:
    """The step's finish reason, or the error body that ends the stream."""
    if step.output is None:
        return None, None
    try:
        return _finish(step.output), None
    except ApiError as exc:
        return None, error_body(exc.message, exc.status, exc.kind)


async def _finals(server: Server, queued: list[Queued], http: Request) -> list[RequestOutput]:
    return list(await asyncio.gather(*(server.final(rid, q, http) for rid, q in queued)))


def install_routes(app: FastAPI, server: Server) -> None:
    app.post("/v1/completions", response_model=None)(_completions_route(server))
    app.post("/v1/chat/completions", response_model=None)(_chat_route(server))


def _prompt_list(prompt: str | list[int] | list[str] | list[list[int]]) -> list[str | list[int]]:
    """One text, one token-id list, several texts or several token-id lists (one prompt each)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, str | list) for p in prompt):
        return list(prompt)  # type: ignore[arg-type]
    return [list(prompt)]  # type: ignore[arg-type]


def _check_completion(body: CompletionRequest) -> int:
    """The token limit to generate with (``max_tokens=0`` runs one token, then drops it)."""
    if body.stream and body.echo:
        raise ApiError(400, "echo=true is not supported with stream=true; send stream=false", param="echo")
    max_tokens = 16 if body.max_tokens is None else body.max_tokens
    if max_tokens == 0 and not body.echo:
        message = "max_tokens must be >= 1, got 0 (0 is for echo=true: the prompt's logprobs only)"
        raise ApiError(400, message, param="max_tokens")
    return max_tokens


def _completion_choice(
    server: Server,
    index: int,
    output: RequestOutput,
    prompt: tuple[str, list[int]] | None,
    body: CompletionRequest,
) -> tuple[dict[str, Any], int]:
    """One choice of a whole response and its completion token count; ``prompt`` (text, ids) is echoed."""
    completion, finish = output.outputs[0], _finish(output)
    token_ids, text = list(completion.token_ids), completion.text
    entries: list[dict[int, Logprob] | None] = list(completion.logprobs or [])
    if body.max_tokens == 0:  # the one token generated is not part of the answer
        token_ids, entries, text, finish = [], [], "", "length"
    logprobs = None
    if body.logprobs is not None:
        if prompt is not None:
            prompt_entries = output.prompt_logprobs or [None] * len(prompt[1])
            token_ids, entries = prompt[1] + token_ids, [*prompt_entries, *entries]
        logprobs = CompletionLogprobs(server.texts).block(token_ids, entries)
    echoed = prompt[0] if prompt is not None else ""
    choice = {"index": index, "text": echoed + text, "finish_reason": finish, "logprobs": logprobs}
    return choice, 0 if body.max_tokens == 0 else len(completion.token_ids)


def _echo_text(server: Server, prompt: str | list[int], skip: bool) -> str:
    if isinstance(prompt, str):
        return prompt
    tokenizer = server.engine.llm.tokenizer
    return str(tokenizer.decode(prompt, skip_special_tokens=skip)) if tokenizer is not None else ""


def _completion_stream_choice(
    server: Server, body: CompletionRequest, count: int
) -> Callable[[int, Step], Any]:
    builders = [CompletionLogprobs(server.texts) for _ in range(count)]

    def choice(i: int, step: Step) -> dict[str, Any] | None:
        finish, error = _step_finish(step)
        if error is not None:
            return error
        if not step.text and finish is None:
            return None
        logprobs = builders[i].block(step.token_ids, step.logprobs) if body.logprobs is not None else None
        return {"index": i, "text": step.text, "finish_reason": finish, "logprobs": logprobs}

    return choice


def _completions_route(server: Server) -> Callable[..., Any]:
    async def completions(body: CompletionRequest, http: Request) -> Any:
        server.check_model(body.model)
        max_tokens = _check_completion(body)
        k = body.logprobs
        extra = {"logprobs": k, "prompt_logprobs": k if body.echo else None}
        params = server.params(body, max(max_tokens, 1), **extra)
        prompts = _prompt_list(body.prompt)
        ids = await server.tokenize(prompts)
        queued = server.submit(ids, params, body.cache_salt)
        if body.stream:
            per_step = _completion_stream_choice(server, body, len(queued))
            with_usage = partial(_usage_of, ids, body.n) if _include_usage(body) else None
            return _streaming(server, queued, params.skip_special_tokens, False, per_step, with_usage)
        outputs = await _finals(server, queued, http)
        choices, generated = [], 0
        for i, output in enumerate(outputs):
            p = i // body.n
            echo = (_echo_text(server, prompts[p], params.skip_special_tokens), ids[p]) if body.echo else None
            choice, count = _completion_choice(server, i, output, echo, body)
            choices.append(choice)
            generated += count
        usage = _usage_of(ids, body.n, outputs, generated)  # max_tokens=0 with echo generates none
        return {**_head("text_completion", "cmpl", server), "choices": choices, "usage": usage}

    return completions


def _chat_stream_choice(server: Server, body: ChatCompletionRequest) -> Callable[[int, Step], Any]:
    def choice(i: int, step: Step) -> dict[str, Any] | None:
        finish, error = _step_finish(step)
        if error is not None:
            return error
        if not step.text and finish is None:
            return None
        top = body.top_logprobs or 0
        logprobs = chat_logprobs(server.texts, step.token_ids, step.logprobs, top) if body.logprobs else None
        return {"index": i, "delta": {"content": step.text}, "finish_reason": finish, "logprobs": logprobs}

    return choice


def _chat_route(server: Server) -> Callable[..., Any]:
    async def chat(body: ChatCompletionRequest, http: Request) -> Any:
        server.check_model(body.model)
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        params = server.params(body, body.max_completion_tokens or body.max_tokens, logprobs=logprobs)
        text = await server.chat_text([m.model_dump(exclude_none=True) for m in body.messages])
        ids = await server.tokenize([text])
        queued = server.submit(ids, params, body.cache_salt)
        if body.stream:
            per_step = _chat_stream_choice(server, body)
            with_usage = partial(_usage_of, ids, body.n) if _include_usage(body) else None
            return _streaming(server, queued, params.skip_special_tokens, True, per_step, with_usage)
        outputs = await _finals(server, queued, http)
        choices = []
        for i, output in enumerate(outputs):
            completion = output.outputs[0]
            message = {"role": "assistant", "content": completion.text}
            lp = None
            if body.logprobs:
                lp = chat_logprobs(
                    server.texts, completion.token_ids, completion.logprobs or [], logprobs or 0
                )
            choices.append({"index": i, "message": message, "finish_reason": _finish(output), "logprobs": lp})
        return {
            **_head("chat.completion", "chatcmpl", server),
            "choices": choices,
            "usage": _usage_of(ids, body.n, outputs),
        }

    return chat
