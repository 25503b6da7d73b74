"""The engine on its own thread, fed by asyncio request handlers (continuous batching).

Glossary:

* **inbox** — commands from handlers to the engine thread: add a request, abort one, stop.
* **event** — what the engine thread sends a request's handler after each step that changed it: the
  token ids generated so far, the logprobs entries of the tokens new since the last event (when the
  request asked for them) and, once finished, the final ``RequestOutput`` (snapshots: handlers never
  read the live ``Request``).

New requests join the batch at the next step; a request whose client goes away is aborted, which frees
its cache slot at once. The thread holds the ``LLM``'s generate lock for its whole life, so offline
``generate`` calls on the same ``LLM`` wait rather than interleave.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from spec_backend.engine.params import RequestOutput, SampleLogprobs, SamplingParams
from spec_backend.engine.request import Request

logger = logging.getLogger("spec_backend.server")


@dataclass(frozen=True)
class Event:
    """One update for one request (see the module glossary)."""

    token_ids: list[int]
    output: RequestOutput | None = None  # set when the request finished
    logprobs: SampleLogprobs | None = None  # entries of the tokens new since the previous event


@dataclass
class _Stream:
    request: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    sent: int = -1  # tokens already reported (-1: nothing reported yet)


class AsyncEngine:
    """Serve one ``LLM`` to many concurrent asyncio clients (see the module docstring)."""

    def __init__(self, llm: Any, registry: Any | None = None) -> None:
        from prometheus_client import Counter

        self.llm = llm
        self.aborted = Counter(
            "spec_backend_server_requests_aborted",
            "Requests ended early because their client went away",
            registry=registry if registry is not None else llm.metrics.registry,
        )
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._ids = threading.Lock()  # make_requests draws ids and seeds from the LLM's generator
        self._streams: dict[str, _Stream] = {}
        self._thread = threading.Thread(target=self._run, name="spec-backend-engine", daemon=True)
        self._stopped = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self, message: str = "server shutting down") -> None:
        """Fail whatever is still in flight with ``message`` and end the engine thread."""
        self._send("stop", message)
        self._stopped.wait(timeout=60)

    def submit(self, prompts: list[Any], params: SamplingParams) -> list[tuple[str, asyncio.Queue[Event]]]:
        """Queue the requests of ``prompts``, ``params.n`` consecutive samples each (seeded as offline
        ``generate`` seeds them): every one or, for bad input (``ValueError``), none."""
        if self._stopped.is_set():
            raise RuntimeError("the engine has stopped")
        with self._ids:
            requests = self.llm.make_requests(prompts, params)
        loop = asyncio.get_running_loop()
        streams = [_Stream(request, loop) for request in requests]
        self._send("add", streams)
        return [(stream.request.request_id, stream.events) for stream in streams]

    def abort(self, request_id: str) -> None:
        self._send("abort", request_id)

    def _send(self, command: str, payload: Any) -> None:
        if self._stopped.is_set() and command != "stop":
            raise RuntimeError("the engine has stopped")
        self._inbox.put((command, payload))
        self._wake.set()

    # -- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.llm.engine
        with self.llm._lock:
            engine.ensure_idle()
            try:
                while self._drain(engine):
                    if not engine.has_unfinished():
                        self._wake.wait()
                        self._wake.clear()
                        continue
                    self._step(engine)
            finally:
                engine.abort_all("server shutting down")
                self._publish(engine)
                self._stopped.set()

    def _drain(self, engine: Any) -> bool:
        """Apply every queued command; ``False`` once told to stop."""
        while True:
            try:
                command, payload = self._inbox.get_nowait()
            except queue.Empty:
                return True
            if command == "add":
                for stream in payload:
                    self._streams[stream.request.request_id] = stream
                    engine.add(stream.request)
            elif command == "abort" and payload in self._streams:
                request = self._streams[payload].request
                if not request.finished:
                    engine.abort(request, "aborted: the client went away")
                    self.aborted.inc()
                    self._publish(engine)
            elif command == "stop":
                engine.abort_all(str(payload))
                return False

    def _step(self, engine: Any) -> None:
        try:
            engine.step()
        except Exception as exc:
            logger.exception("engine step failed; every unfinished request ends with an error")
            engine.abort_all(f"engine failed: {type(exc).__name__}: {exc}")
        self._publish(engine)

    def _publish(self, engine: Any) -> None:
        """Send each changed request its event; forget the finished ones."""
        for request_id, stream in list(self._streams.items()):
            request = stream.request
            count = len(request.output_token_ids)
            if count == stream.sent and not request.finished:
                continue
            output = request.to_output(self.llm.tokenizer) if request.finished else None
            new = request.logprobs[max(stream.sent, 0) : count] if request.logprobs is not None else None
            event = Event(list(request.output_token_ids), output, new)
            stream.sent = count
            stream.loop.call_soon_threadsafe(stream.events.put_nowait, event)
            if output is not None:
                del self._streams[request_id]
