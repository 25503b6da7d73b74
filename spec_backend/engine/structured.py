"""Structured outputs: a request's output constrained to a JSON schema, a regex, a choice or a grammar,
with speculation on and the output equal to non-speculative constrained decoding.

Grammars run on llguidance (the ``structured`` extra): a small Rust wheel without a torch dependency
whose token masks are computed on the CPU from the tokenizer's byte strings, lazily as the output grows
(no up-front compilation of a schema), and which validates a list of tokens in one call
(``validate_tokens``), what drafts need.

Glossary:

* **matcher** — one request's grammar state (an ``llguidance.LLMatcher``) after its output tokens.
* **row mask** — ``[V]`` bool, the tokens the grammar allows at one verify row: the state after the
  request's output and the drafts fed before that row (``logits.RowHistory``).
* **cut** — a draft the grammar forbids ends the request's drafts there: it and the drafts after it
  become placeholders before verification (never verified, never counted as drafted); the row at the
  cut samples the target's masked distribution, as plain decoding would.

Every verify row's logits are masked with its row mask before the sampler (``process_logits``), so the
sampler verifies against the constrained target distribution: greedy output equals constrained plain
decoding token for token, and sampled output keeps its law (the sampler is lossless for any target).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

INSTALL_HINT = "structured outputs need llguidance: pip install 'spec-backend[structured]'"
_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True, kw_only=True)
class StructuredOutputsParams:
    """vLLM's ``StructuredOutputsParams``: exactly one of

    * ``json`` — a JSON schema (dict or JSON text); ``json_object=True`` — any JSON object;
    * ``regex`` — the whole output matches it (Rust ``regex`` syntax);
    * ``choice`` — the output is one of these strings;
    * ``grammar`` — a Lark grammar (llguidance's dialect), or GBNF (llama.cpp's; told by ``::=``).

    ``disable_any_whitespace`` (JSON only, vLLM's default ``False``): no whitespace between JSON tokens,
    where by default any run of it is allowed (a weak model can spend its budget on newlines).
    """

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    kind: str = field(init=False, default="")

    def __post_init__(self) -> None:
        given = [name for name in _KINDS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"structured_outputs must set exactly one of {', '.join(_KINDS)}, got {given or 'none'}"
            )
        object.__setattr__(self, "kind", given[0])
        if self.json is not None and not isinstance(self.json, dict | str):
            raise ValueError(f"structured_outputs.json must be a dict or JSON text, got {self.json!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None and (
            not isinstance(self.choice, list | tuple)
            or not self.choice
            or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError(
                "structured_outputs.choice must be a non-empty list of non-empty strings, "
                f"got {self.choice!r}"
            )
        if self.json_object not in (None, True, False):
            raise ValueError(f"structured_outputs.json_object must be a bool, got {self.json_object!r}")
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError(
                "structured_outputs.disable_any_whitespace must be a bool, "
                f"got {self.disable_any_whitespace!r}"
            )
        if self.disable_any_whitespace and self.kind not in ("json", "json_object"):
            raise ValueError(
                f"structured_outputs.disable_any_whitespace applies to json and json_object, got {self.kind}"
            )

    @staticmethod
    def of(value: Any) -> StructuredOutputsParams | None:
        """``value`` as params: ``None``, params, or a dict of their fields (other keys refused by name)."""
        if value is None or isinstance(value, StructuredOutputsParams):
            return value
        if not isinstance(value, dict):
            raise ValueError(
                f"structured_outputs must be a StructuredOutputsParams or a dict, got {type(value).__name__}"
            )
        known = {f.name for f in fields(StructuredOutputsParams) if f.init}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"structured_outputs does not take {', '.join(unknown)}; it takes {', '.join(sorted(known))}"
            )
        return StructuredOutputsParams(**value)

    def lark_source(self) -> str:
        """The llguidance grammar text of these params."""
        from llguidance import LLMatcher

        if self.json is not None or self.json_object:
            schema = {"type": "object"} if self.json_object else self.json
            text = schema if isinstance(schema, str) else json.dumps(schema)
            options: Any = {"whitespace_flexible": not self.disable_any_whitespace}
            return str(LLMatcher.grammar_from_json_schema(text, overrides=options))
        if self.regex is not None:
            return str(LLMatcher.grammar_from_regex(self.regex))
        if self.choice is not None:
            return "start: " + " | ".join(json.dumps(c) for c in self.choice)
        assert self.grammar is not None
        if "::=" in self.grammar:
            from llguidance.gbnf_to_lark import gbnf_to_lark

            return str(LLMatcher.grammar_from_lark(gbnf_to_lark(self.grammar)))
        return str(LLMatcher.grammar_from_lark(self.grammar))


class _TokenBytes:
    """A tokenizer as llguidance's ``TokenizerWrapper`` reads it (every token's bytes), for tokenizers
    its Hugging Face reader does not know (no byte-level or byte-fallback decoder)."""

    def __init__(self, tokenizer: Any, eos: Sequence[int]) -> None:
        special = set(tokenizer.all_special_ids)
        self.eos_token_id, self.bos_token_id = min(eos), None
        self.special_token_ids = sorted(special)
        self.tokens = [
            (tokenizer.convert_ids_to_tokens(i) if i in special else tokenizer.decode([i])).encode()
            for i in range(len(tokenizer))
        ]
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        data = text.decode() if isinstance(text, bytes) else text
        return list(self._tokenizer.encode(data, add_special_tokens=False))


_LL_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _ll_tokenizer(tokenizer: Any, eos: Sequence[int], vocab: int) -> Any:
    """llguidance's view of ``tokenizer`` (built once per tokenizer: about a second for 150k tokens)."""
    cached = _LL_TOKENIZERS.get(tokenizer)
    if cached is not None:
        return cached
    import llguidance
    import llguidance.hf

    try:
        made = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=list(eos))
    except ValueError:  # a decoder llguidance cannot read: hand it every token's bytes
        from llguidance._tokenizer import TokenizerWrapper

        made = llguidance.LLTokenizer(
            TokenizerWrapper(_TokenBytes(tokenizer, eos)), n_vocab=vocab, eos_token=list(eos)
        )
    _LL_TOKENIZERS[tokenizer] = made
    return made


class RequestGrammar:
    """One request's matcher (module glossary) over a vocabulary of ``vocab`` logits columns, of which
    the tokenizer's first ``known`` are tokens (ids past them: padding rows of the embedding)."""

    def __init__(self, matcher: Any, vocab: int, known: int) -> None:
        self.matcher, self.vocab, self.known = matcher, vocab, known

    def valid_prefix(self, drafts: Sequence[int]) -> int:
        """How many of ``drafts`` the grammar allows in a row, from the current state (an id the
        tokenizer does not have is never allowed: llguidance would enter its error state)."""
        known = next((j for j, t in enumerate(drafts) if not 0 <= t < self.known), len(drafts))
        valid = int(self.matcher.validate_tokens(list(drafts[:known]))) if known else 0
        self._check()
        return valid

    def row_masks(self, drafts: Sequence[int], rows: int) -> torch.Tensor:
        """``[rows, V]`` bool: row ``j`` masks the state after ``drafts[:j]`` (``drafts``: the valid ones);
        rows past ``len(drafts)`` are past the cut, never emitted, and repeat the cut row's mask."""
        real = min(len(drafts) + 1, rows)
        bits = torch.empty(real, (self.known + 31) // 32, dtype=torch.int32)  # [real, W]: llguidance's size
        for j in range(real):
            row = bits[j]  # [W]
            self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
            if j < real - 1 and not self.matcher.consume_token(drafts[j]):
                self._check()
                raise RuntimeError(f"structured output: the grammar refused validated draft {drafts[j]}")
        if real > 1:
            self.matcher.rollback(real - 1)
        self._check()
        allowed = unpack_bitmask(bits, self.vocab)  # [real, V]
        return torch.cat([allowed, allowed[-1:].expand(rows - real, -1)]) if rows > real else allowed

    def accept(self, tokens: Sequence[int]) -> None:
        """Advance past the request's kept ``tokens`` (each one allowed by its row's mask)."""
        for token in tokens:
            if not 0 <= token < self.known or not self.matcher.consume_token(token):
                self._check()
                raise RuntimeError(f"structured output: the grammar refused kept token {token}")
        self._check()

    def _check(self) -> None:
        """A matcher in llguidance's error state allows only EOS from then on: raise instead."""
        if self.matcher.is_error():
            raise RuntimeError(f"structured output: the grammar failed: {self.matcher.get_error()}")


def unpack_bitmask(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[R, W]`` int32 bitmask (bit ``t % 32`` of word ``t // 32`` allows token ``t``) -> ``[R, vocab]``
    bool; tokens past the bitmask's end are not allowed."""
    shifts = torch.arange(32, dtype=torch.int32)  # [32]
    allowed = ((bits[:, :, None] >> shifts) & 1).bool().reshape(bits.shape[0], -1)  # [R, W * 32]
    if allowed.shape[1] < vocab:
        allowed = torch.cat([allowed, allowed.new_zeros(bits.shape[0], vocab - allowed.shape[1])], dim=1)
    return allowed[:, :vocab]


def constrain(
    grammars: Sequence[RequestGrammar | None],  # per request: its matcher (None: no grammar, or finished)
    drafts: Sequence[Sequence[int]],  # per request: its real drafts (placeholders dropped)
    query_lens: Sequence[int],
    last_only: bool,
    vocab: int,
) -> tuple[list[int], torch.Tensor]:
    """Per request, how many of its drafts its grammar allows (all of them without a grammar), and the
    ``[R, V]`` bool row masks of the step (rows of requests without a grammar allow every token)."""
    kept: list[int] = []
    masks: list[torch.Tensor] = []
    for b, grammar in enumerate(grammars):
        rows = 1 if last_only else query_lens[b]
        if grammar is None:
            kept.append(len(drafts[b]))
            masks.append(torch.ones(rows, vocab, dtype=torch.bool))  # [rows, V]
            continue
        n = grammar.valid_prefix(drafts[b])
        kept.append(n)
        masks.append(grammar.row_masks(drafts[b][:n], rows))  # [rows, V]
    return kept, torch.cat(masks)


def make_grammars(
    specs: Sequence[StructuredOutputsParams | None], eos: frozenset[int], tokenizer: Any | None, vocab: int
) -> list[RequestGrammar | None]:
    """A matcher per request that asks for structured outputs (``specs``: each request's
    ``structured_outputs``); ``ValueError`` for a grammar that does not compile, a model without
    tokenizer or EOS, or llguidance missing."""
    if all(spec is None for spec in specs):
        return [None] * len(specs)
    if tokenizer is None:
        raise ValueError("structured_outputs needs the model's tokenizer; this model has none")
    if not eos:
        raise ValueError("structured_outputs needs an EOS token to end the output; this model has none")
    try:
        from llguidance import LLMatcher
    except ImportError as exc:
        raise ValueError(INSTALL_HINT) from exc
    ll_tokenizer = _ll_tokenizer(tokenizer, sorted(eos), vocab)
    grammars: list[RequestGrammar | None] = []
    for spec in specs:
        if spec is None:
            grammars.append(None)
            continue
        matcher = LLMatcher(ll_tokenizer, spec.lark_source(), log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured_outputs.{spec.kind} does not compile: {matcher.get_error()}")
        grammars.append(RequestGrammar(matcher, vocab, ll_tokenizer.vocab_size))
    return grammars


__all__ = [
    "INSTALL_HINT",
    "RequestGrammar",
    "StructuredOutputsParams",
    "constrain",
    "make_grammars",
    "unpack_bitmask",
]
