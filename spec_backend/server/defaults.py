"""The server's defaults that the command line shows, in a module of their own: ``spec-backend --help``
reads them without the serve extra (``limits`` imports starlette)."""

from __future__ import annotations

#: Default request body cap (``limits.BodyLimit``): room for a 128k-token prompt as text or as token ids,
#: and a bound on what one request costs when the tokenizer gives no characters-per-token bound
#: (``textbound``): tokenizing 2 MB of text takes seconds of CPU (on a worker thread) and hundreds of
#: megabytes.
DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024

__all__ = ["DEFAULT_MAX_BODY_BYTES"]
