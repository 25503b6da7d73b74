"""Server-sent event streams of one or more choices (``n`` samples of one or several prompts), each
chunk carrying its choice's ``index``; the stream ends with ``data: [DONE]``.

Glossary: a **step** is what one choice adds between two chunks: its text delta, the tokens behind it
and their logprobs entries (tokens that decode to no printable text yet wait for the next step).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from spec_backend.engine.params import Logprob, RequestOutput
from spec_backend.server.detokenize import IncrementalDetokenizer
from spec_backend.server.loop import Event

if TYPE_CHECKING:
    from spec_backend.server.state import Server

T = TypeVar("T")
Queued = tuple[str, "asyncio.Queue[Event]"]


@dataclass
class Step:
    """What one choice adds to the stream (module glossary); ``output`` is set on the last one."""

    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]
    output: RequestOutput | None


def sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def steps(server: Server, queued: Queued, skip_special: bool) -> AsyncIterator[Step]:
    """The steps of one request as it generates; the request is aborted if the consumer stops early
    (the client went away)."""
    request_id, events = queued
    tokenizer, sent, done = server.engine.llm.tokenizer, "", False
    stream = IncrementalDetokenizer(tokenizer, skip_special) if tokenizer is not None else None
    given, pending = 0, []  # tokens handed out so far; logprobs entries not yet handed out
    try:
        while not done:
            event = await events.get()
            done = event.output is not None
            if event.output is not None:  # the final text (stop strings cut) settles what is left
                completion = event.output.outputs[0]
                delta = completion.text[len(sent) :] if completion.text.startswith(sent) else ""
                tokens, pending = completion.token_ids, list((completion.logprobs or [])[given:])
            else:
                tokens = event.token_ids
                pending += event.logprobs or []
                delta = stream.step(tokens) if stream is not None else ""
                if not delta:
                    continue
            sent += delta
            yield Step(delta, list(tokens[given:]), pending, event.output)
            given, pending = len(tokens), []
    finally:
        if not done:
            server.engine.abort(request_id)


async def merged(sources: list[AsyncIterator[T]]) -> AsyncGenerator[T, None]:
    """The items of every source as they come. Each source runs as a task; leaving early cancels
    them all (a cancelled ``steps`` aborts its request)."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def pump(source: AsyncIterator[T]) -> None:
        try:
            async for item in source:
                queue.put_nowait(("item", item))
            queue.put_nowait(("end", None))
        except Exception as exc:
            queue.put_nowait(("raise", exc))

    tasks = [asyncio.create_task(pump(source)) for source in sources]
    try:
        ended = 0
        while ended < len(tasks):
            kind, value = await queue.get()
            if kind == "raise":
                raise value
            if kind == "end":
                ended += 1
                continue
            yield value
    finally:
        for task in tasks:
            task.cancel()


def _chunk(server: Server, kind: str, rid: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": server.model_name,
        "choices": [choice],
    }


async def stream(
    server: Server,
    queued: list[Queued],
    skip_special: bool,
    chat: bool,
    choice: Callable[[int, Step], dict[str, Any] | None],
    usage: Callable[[list[RequestOutput]], dict[str, Any]] | None = None,
) -> AsyncIterator[str]:
    """The event stream of ``queued`` (choice ``i`` is ``queued[i]``): ``choice(i, step)`` turns a
    step into the choice object to send, ``None`` to send nothing, or an ``{"error": ...}`` body that
    ends the stream with that error. ``usage``: the usage object of the final outputs (in choice
    order), sent in a last chunk with empty ``choices`` (``stream_options.include_usage``)."""
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    kind = "chat.completion.chunk" if chat else "text_completion"
    if chat:
        for i in range(len(queued)):
            first = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
            yield sse(_chunk(server, kind, rid, {**first, "finish_reason": None}))

    finals: dict[int, RequestOutput] = {}

    async def one(i: int) -> AsyncIterator[dict[str, Any]]:
        async for step in steps(server, queued[i], skip_special):
            if step.output is not None:
                finals[i] = step.output
            item = choice(i, step)
            if item is not None:
                yield item

    failed = False
    async with aclosing(merged([one(i) for i in range(len(queued))])) as items:
        async for item in items:
            if "error" in item:
                yield sse(item)
                failed = True
                break
            yield sse(_chunk(server, kind, rid, item))
    if usage is not None and not failed:
        outputs = [finals[i] for i in range(len(queued))]
        yield sse({**_chunk(server, kind, rid, {}), "choices": [], "usage": usage(outputs)})
    yield sse("[DONE]")


__all__ = ["Queued", "Step", "merged", "sse", "steps", "stream"]
