"""OpenAI request bodies (the fields this server honours) and OpenAI-style error bodies.

* Unknown fields are refused with 400 and their names, never ignored.
* A field sent as ``null`` counts as absent (the official client sends ``null`` for anything passed as
  ``None``); a required field sent as ``null`` is refused as having the wrong type.
* Types are strict: ``"max_tokens": "10"``, ``"stream": "yes"`` or ``[true, 2]`` as token ids are
  refused, not coerced (an integer is accepted where a number is expected).
* Text must be valid Unicode: a lone UTF-16 surrogate (JSON ``"\\ud800"``) is refused by path.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from spec_backend.server.structured import ResponseFormat

#: Most top tokens per position (``logprobs`` in completions, ``top_logprobs`` in chat): OpenAI's chat
#: limit, and vLLM's default ``max_logprobs``.
MAX_TOP_LOGPROBS = 20
#: Most samples per prompt: every sample is a request in the engine.
MAX_N = 128


def _lone_surrogate(value: Any, path: str) -> str | None:
    """Where in ``value`` (strings, lists and dicts, keys included) a string first holds a lone
    surrogate, for an error message; ``None`` if nowhere."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            code = ord(value[exc.start])
            return f"{path or 'body'} holds a lone UTF-16 surrogate U+{code:04X} at character {exc.start}"
        return None
    items: list[tuple[str, Any]] = []
    if isinstance(value, list):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        for key, v in value.items():
            name = f"{path}.{key}" if path else str(key)
            items += [(f"{path or 'body'}: key {key!a}", key), (name, v)]
    for where, item in items:
        found = _lone_surrogate(item, where)
        if found is not None:
            return found
    return None


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        where = _lone_surrogate(data, "")
        if where is not None:
            message = "{where}: text must be valid Unicode (a \\ud800-\\udfff escape must be half of a pair)"
            raise PydanticCustomError("unicode", message, {"where": where})
        required = {name for name, info in cls.model_fields.items() if info.is_required()}
        return {k: v for k, v in data.items() if v is not None or k in required}


class StreamOptions(BaseModel):
    """OpenAI's ``stream_options``: ``include_usage`` sends one more chunk before ``[DONE]`` with empty
    ``choices`` and the request's ``usage``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Sampling(_Body):
    model: str
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)  # vLLM's extension (0: off)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions (checked by SamplingParams: a bad value is a 400 naming it)
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    user: str | None = None
    #: vLLM's extension: only requests with the same salt share prefix-cache blocks
    cache_salt: str | None = Field(default=None, min_length=1)
    # structured outputs (``server/structured.py``): at most one of these
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _Sampling:
        if self.stream_options is not None and not self.stream:
            raise PydanticCustomError(
                "stream_options", "stream_options is only allowed with stream=true (got stream=false)"
            )
        return self


class CompletionRequest(_Sampling):
    #: One text, one token-id list, several texts, or several token-id lists (one choice each).
    prompt: str | list[int] | list[str] | list[list[int]]
    #: 0 only with ``echo``: the prompt's log-probabilities and no completion (what eval harnesses ask).
    max_tokens: int | None = Field(default=None, ge=0)
    #: The ``k`` most likely tokens at each position (0: the chosen token's log-probability only).
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)


def error_body(message: str, status: int, kind: str, param: str | None = None) -> dict[str, Any]:
    """``{"error": {...}}`` as the OpenAI API returns it."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
