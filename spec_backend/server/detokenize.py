"""Streaming text from growing token lists without decoding the whole output at every step.

Glossary: the *read offset* is how many tokens have been turned into text; the *prefix offset* is a few
tokens before it. Each step decodes only ``tokens[prefix_offset:]`` and emits what it adds to the text
of ``tokens[prefix_offset:read_offset]``: the prefix gives tokenizers that join pieces (leading spaces,
byte-level merges) the context they need, so the concatenated deltas equal the whole decode. A delta
ending in U+FFFD (a multi-byte character still incomplete) waits for the next token. Work per step is
bounded by the window, not by the output length (decoding the whole output every step is quadratic).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Text deltas of one request (module docstring)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, tokens: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=self.skip))

    def step(self, tokens: Sequence[int]) -> str:
        """The text ``tokens`` (the whole output so far) adds to what earlier steps returned."""
        if len(tokens) <= self.read_offset:
            return ""
        prefix = self._decode(tokens[self.prefix_offset : self.read_offset])
        text = self._decode(tokens[self.prefix_offset :])
        if len(text) <= len(prefix) or text.endswith(_REPLACEMENT):
            return ""  # nothing printable yet (a special token skipped, or a character incomplete)
        self.prefix_offset, self.read_offset = self.read_offset, len(tokens)
        return text[len(prefix) :]


__all__ = ["IncrementalDetokenizer"]
