"""A sound bound on how many characters one token can stand for, so that text too long for
``max_model_len`` is refused before it is tokenized (tokenizing megabytes takes seconds and gigabytes).

Glossary:

* **covered characters** — the characters of the (normalized, pre-tokenized) text one token accounts
  for. With ``L`` the longest vocabulary or added-token string, a token covers at most ``L`` of them,
  provided no step of the pipeline drops characters or folds an unbounded run of them into one token.
* **contraction** — how many input characters a normalizer may turn into one (NFC composes at most 4
  code points into one: the longest canonical decomposition in Unicode is 4 code points long).

A text of ``N`` characters then has at least ``N / (contraction * L)`` tokens. The bound exists only for
pipelines whose every step is known to keep that promise; anything else (a normalizer that strips or
collapses whitespace, a pre-tokenizer that removes it, a word-level or WordPiece model whose unknown
token covers a whole word, unknown characters fused into one token, added tokens that swallow the
spaces around them, a tokenizer without a Rust pipeline to inspect) gets no bound: such text is
tokenized (off the event loop) and measured after.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: Normalizers that never shorten text, and those that shorten it by at most a known factor.
_KEEPS_LENGTH = {"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"}
_CONTRACTS = {"NFC": 4, "NFKC": 4}
#: Pre-tokenizers that keep every character (``Split``/``Punctuation`` unless their behavior removes).
_PRE_KEEPS = {"ByteLevel", "Metaspace", "Digits"}
_PRE_WITH_BEHAVIOR = {"Split", "Punctuation"}


def _parts(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """The steps of a normalizer or pre-tokenizer (a ``Sequence`` flattened; none for ``None``)."""
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [p for child in node.get(key, []) for p in _parts(child, key)]
    return [node]


def _contraction(normalizer: dict[str, Any] | None) -> float | None:
    """The most input characters the normalizer turns into one; ``None`` if it may drop characters."""
    factor = 1.0
    for step in _parts(normalizer, "normalizers"):
        kind = step.get("type")
        if kind in _KEEPS_LENGTH:
            continue
        if kind in _CONTRACTS:
            factor *= _CONTRACTS[kind]
        elif kind == "Replace" and "String" in step.get("pattern", {}) and step.get("content"):
            factor *= max(1.0, len(step["pattern"]["String"]) / len(step["content"]))
        else:  # Strip, StripAccents, BertNormalizer, Precompiled, Nmt, regex Replace, ...
            return None
    return factor


def _pre_tokenizer_keeps_text(pre_tokenizer: dict[str, Any] | None) -> bool:
    for step in _parts(pre_tokenizer, "pretokenizers"):
        kind = step.get("type")
        if kind in _PRE_WITH_BEHAVIOR:
            if step.get("behavior", "Isolated") == "Removed" or step.get("invert"):
                return False
            continue
        if kind not in _PRE_KEEPS:  # Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit, ...
            return False
    return True


def _byte_level(pre_tokenizer: dict[str, Any] | None) -> bool:
    return any(step.get("type") == "ByteLevel" for step in _parts(pre_tokenizer, "pretokenizers"))


def _model_covers_every_character(model: dict[str, Any], pre_tokenizer: dict[str, Any] | None) -> bool:
    """Whether every character reaches some token, one unknown character at most per unknown token."""
    kind = model.get("type")
    if kind == "Unigram":  # unknown characters are fused into one token unless they fall back to bytes
        return bool(model.get("byte_fallback"))
    if kind != "BPE":  # WordLevel, WordPiece: one unknown token for a whole word of any length
        return False
    if model.get("byte_fallback") or (model.get("unk_token") is not None and not model.get("fuse_unk")):
        return True
    if _byte_level(pre_tokenizer):  # the text is made of the 256 byte symbols: all must be tokens
        from tokenizers import pre_tokenizers

        return set(pre_tokenizers.ByteLevel.alphabet()) <= set(model.get("vocab", {}))
    return False


def _longest_token(model: dict[str, Any], added: list[dict[str, Any]]) -> int:
    vocab = model.get("vocab", {})
    pieces = [p[0] for p in vocab] if isinstance(vocab, list) else list(vocab)  # Unigram: [piece, score]
    return max([len(p) for p in pieces] + [len(a.get("content", "")) for a in added] + [1])


def chars_per_token_bound(tokenizer: Any) -> int | None:
    """An upper bound on the input characters one token of ``tokenizer`` stands for, or ``None`` when
    the tokenizer's pipeline gives none (see the module docstring)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    added = spec.get("added_tokens") or []
    if any(a.get("lstrip") or a.get("rstrip") for a in added):
        return None
    contraction = _contraction(spec.get("normalizer"))
    pre_tokenizer = spec.get("pre_tokenizer")
    model = spec.get("model") or {}
    if contraction is None or not _pre_tokenizer_keeps_text(pre_tokenizer):
        return None
    if not _model_covers_every_character(model, pre_tokenizer):
        return None
    return math.ceil(contraction * _longest_token(model, added))


def too_long_for(text: str, max_model_len: int, bound: int | None) -> str | None:
    """Why ``text`` cannot fit ``max_model_len`` tokens whatever it tokenizes to, or ``None`` when it
    may (or when there is no ``bound``). The engine refuses a prompt of ``max_model_len`` tokens or
    more (it leaves no room to generate), and ``text`` has at least ``len(text) / bound`` tokens."""
    if bound is None or len(text) < max_model_len * bound:
        return None
    return (
        f"has {len(text)} characters, so at least {math.ceil(len(text) / bound)} tokens (a token of this "
        f"model's tokenizer stands for at most {bound} characters); max_model_len={max_model_len} leaves "
        "no room to generate (prompt must be shorter than max_model_len)"
    )


__all__ = ["chars_per_token_bound", "too_long_for"]
