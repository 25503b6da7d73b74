"""Log-probabilities in OpenAI's response shapes, from the engine's entries (``SamplingParams.logprobs``
/ ``prompt_logprobs``: per position, token id -> ``Logprob``, the chosen token first, then the ``k`` most
likely).

* Completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, one item per token.
  ``top_logprobs`` maps token text to log-probability for the ``k`` most likely tokens and the chosen
  one (so up to ``k + 1`` items, as OpenAI documents), most likely first. With ``echo`` the prompt's
  tokens come first; the first prompt token has no log-probability (``null`` in both lists).
  ``text_offset`` is where each token starts in the choice's text, counted as the lengths of the token
  texts before it (the texts of single tokens, so a character split across tokens shifts it).
* Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``
  with exactly the ``top_logprobs`` most likely tokens per position.

A token's text is its id decoded alone (vLLM's ``decoded_token``). Values are the target's raw
log-probabilities, equal to offline ``generate``'s; ``-inf`` (not JSON) is sent as -9999.0, as vLLM does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from spec_backend.engine.params import Logprob

_FLOOR = -9999.0


def _value(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _FLOOR


def _ranked(entry: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
    """The entry's tokens, most likely first (the engine's ranks; ties keep the engine's order)."""
    return sorted(entry.items(), key=lambda item: item[1].rank if item[1].rank is not None else 0)


class TokenTexts:
    """Each token id's text, decoded alone and cached (``token_id:N`` without a tokenizer)."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if self.tokenizer is None:
                text = f"token_id:{token_id}"
            else:
                text = str(self.tokenizer.decode([token_id], skip_special_tokens=False))
            self._cache[token_id] = text
        return text


class CompletionLogprobs:
    """Builds completions ``logprobs`` blocks; ``text_offset`` carries on from block to block (one
    choice's stream), starting at 0."""

    def __init__(self, texts: TokenTexts) -> None:
        self.texts, self.offset = texts, 0

    def block(self, token_ids: Sequence[int], entries: Sequence[dict[int, Logprob] | None]) -> dict[str, Any]:
        """The block for ``token_ids`` (``entries[i]`` is token ``i``'s; ``None`` for a prompt's first)."""
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for token, entry in zip(token_ids, entries, strict=True):
            text = self.texts(token)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            if entry is None:
                token_logprobs.append(None)
                top.append(None)
                continue
            token_logprobs.append(_value(entry[token].logprob))
            top.append({self.texts(t): _value(lp.logprob) for t, lp in _ranked(entry)})
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        }


def _chat_token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": _value(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(
    texts: TokenTexts, token_ids: Sequence[int], entries: Sequence[dict[int, Logprob]], top: int
) -> dict[str, Any]:
    """Chat's ``logprobs`` for ``token_ids``, with the ``top`` most likely tokens at each position."""
    content = []
    for token, entry in zip(token_ids, entries, strict=True):
        item = _chat_token(texts(token), entry[token].logprob)
        ranked = [(t, lp) for t, lp in _ranked(entry) if lp.rank is not None and lp.rank <= top][:top]
        item["top_logprobs"] = [_chat_token(texts(t), lp.logprob) for t, lp in ranked]
        content.append(item)
    return {"content": content}


__all__ = ["CompletionLogprobs", "TokenTexts", "chat_logprobs"]
