"""How every command reports a user error: one ``error: ...`` line on stderr and exit status 2."""

from __future__ import annotations

import sys


class CliError(Exception):
    """A user error the CLI reports as one ``error: ...`` line on stderr with exit status 2."""


def fail(message: object) -> int:
    """Print ``message`` as one line (``error: ...``) on stderr; return the usage-error status 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


__all__ = ["CliError", "fail"]
