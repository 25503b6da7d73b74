"""Structured outputs on the server: OpenAI's ``response_format`` and vLLM's ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar`` and ``structured_outputs`` request fields, turned
into the engine's ``StructuredOutputsParams`` (``engine/structured.py``). At most one of them per
request; ``response_format: {"type": "text"}`` is the default (no constraint)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spec_backend.engine.structured import StructuredOutputsParams


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: OpenAI's named schema."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


#: the vLLM request fields that each name one kind of constraint
GUIDED_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


class StructuredOutputError(ValueError):
    """A bad constraint, and the request field at fault (``param``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _from_response_format(fmt: ResponseFormat) -> dict[str, Any] | None:
    if fmt.type == "text":
        if fmt.json_schema is not None:
            raise ValueError('response_format.json_schema is only for type "json_schema", got type "text"')
        return None
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.json_schema is None:
        raise ValueError('response_format of type "json_schema" needs response_format.json_schema')
    return {"json": fmt.json_schema.schema_ or {}}


def structured_of(
    response_format: ResponseFormat | None, guided: dict[str, Any], structured: dict[str, Any] | None
) -> tuple[StructuredOutputsParams | None, str | None]:
    """The request's constraint and the field it came from (``guided``: the ``guided_*`` fields sent);
    ``StructuredOutputError`` naming the field for two sources at once or a bad value."""
    sources: list[tuple[str, dict[str, Any] | None]] = []
    try:
        if response_format is not None:
            sources.append(("response_format", _from_response_format(response_format)))
    except ValueError as exc:
        raise StructuredOutputError(str(exc), "response_format") from exc
    sources += [(name, {GUIDED_FIELDS[name]: value}) for name, value in guided.items()]
    if structured is not None:
        sources.append(("structured_outputs", structured))
    given = [(name, spec) for name, spec in sources if spec is not None]
    if len(given) > 1:
        names = ", ".join(name for name, _ in given)
        raise StructuredOutputError(
            f"a request takes one structured output constraint, got {names}", given[0][0]
        )
    if not given:
        return None, None
    name, spec = given[0]
    try:
        return StructuredOutputsParams.of(spec), name
    except ValueError as exc:
        raise StructuredOutputError(str(exc), name) from exc


__all__ = ["GUIDED_FIELDS", "JsonSchemaFormat", "ResponseFormat", "StructuredOutputError", "structured_of"]
