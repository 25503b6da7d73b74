"""The request body cap: a body over ``max_body_bytes`` is refused with 413 (the JSON error shape)
before it is read (by its ``Content-Length``) or as soon as it passes the cap (a chunked body)."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from spec_backend.server.defaults import DEFAULT_MAX_BODY_BYTES
from spec_backend.server.protocol import error_body


def _too_large(size: int | str, cap: int) -> str:
    return f"request body is {size} bytes; this server takes at most {cap} (serve --max-body-bytes)"


class BodyLimit:
    """ASGI middleware enforcing the cap on every HTTP request (module docstring)."""

    def __init__(self, app: Any, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app, self.cap = app, max_body_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"").decode("latin-1").strip()
        if declared.isdigit() and int(declared) > self.cap:
            message = _too_large(int(declared), self.cap)
            response = JSONResponse(error_body(message, 413, "RequestTooLargeError"), status_code=413)
            await response(scope, receive, send)
            return
        total = 0

        async def counted() -> Any:
            nonlocal total
            message = await receive()
            total += len(message.get("body", b""))
            if total > self.cap:  # raised inside the route's body read: FastAPI passes HTTPException on
                raise HTTPException(413, _too_large(f"over {self.cap}", self.cap))
            return message

        await self.app(scope, counted, send)


__all__ = ["DEFAULT_MAX_BODY_BYTES", "BodyLimit"]
