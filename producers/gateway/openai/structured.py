"""OpenAI's `response_format` and vLLM's structured-output fields, mapped onto the native `ResponseFormat`.

    response_format   {"type": "text" | "json_object"} | {"type": "json_schema", "json_schema": {name, schema, strict}}
    structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object": ...}   (vLLM >= 0.10)
    guided_json, guided_regex, guided_choice, guided_grammar                            (vLLM, older names)

At most one of them may constrain a request; two are a 400 naming the second.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from producers.gateway.admission.requests import ResponseFormat
from producers.gateway.errors import ApiError


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    # OpenAI's default: not strict (our grammar still constrains; unsupported keywords are ignored then).
    strict: bool | None = None


class OpenAIResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def native(self) -> ResponseFormat | None:
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ApiError(400, "invalid_request", "response_format: type json_schema needs json_schema",
                               {"field": "response_format"})
            return ResponseFormat(type="json_schema", json_schema=self.json_schema.json_schema or {},
                                  strict=bool(self.json_schema.strict))
        if self.json_schema is not None:
            raise ApiError(400, "invalid_request", f"response_format: json_schema goes with type json_schema only",
                           {"field": "response_format"})
        return None if self.type == "text" else ResponseFormat(type="json_object")


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one constraint."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None


def schema_of(value: dict[str, Any] | str, field: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        schema = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ApiError(400, "invalid_response_format", f"{field} is not a JSON schema: {exc.msg}",
                       {"field": field}) from None
    if not isinstance(schema, dict):
        raise ApiError(400, "invalid_response_format", f"{field} is not a JSON schema object", {"field": field})
    return schema


def from_vllm(field: str, kind: str, value: Any) -> ResponseFormat:
    """One of vLLM's constraints as the native format (field names the request field, for a 400)."""
    try:
        if kind == "json":
            return ResponseFormat(type="json_schema", json_schema=schema_of(value, field), strict=False)
        if kind == "regex":
            return ResponseFormat(type="regex", pattern=value)
        if kind == "choice":
            return ResponseFormat(type="choice", choices=value)
        if kind == "grammar":
            return ResponseFormat(type="grammar", grammar=value)
        return ResponseFormat(type="json_object")
    except ValueError as exc:  # pydantic's ValidationError is one
        message = exc.errors()[0]["msg"] if hasattr(exc, "errors") else str(exc)
        raise ApiError(400, "invalid_response_format", f"{field}: {message}", {"field": field}) from None


def structured_format(response_format: OpenAIResponseFormat | None, structured: StructuredOutputs | None,
                      guided: dict[str, Any]) -> ResponseFormat | None:
    """The one native format the request's fields ask for (None: plain text); 400 when two ask."""
    found: list[tuple[str, ResponseFormat]] = []
    if response_format is not None:
        native = response_format.native()
        if native is not None:
            found.append(("response_format", native))
    if structured is not None:
        if structured.whitespace_pattern is not None:
            raise ApiError(400, "unsupported_parameter", "structured_outputs.whitespace_pattern is not supported: "
                           "JSON is generated compactly", {"field": "structured_outputs"})
        for kind in ("json", "regex", "choice", "grammar", "json_object"):
            value = getattr(structured, "json_" if kind == "json" else kind)
            if value not in (None, False):
                found.append(("structured_outputs", from_vllm("structured_outputs", kind, value)))
    for field, value in guided.items():
        if value is not None:
            found.append((field, from_vllm(field, field.removeprefix("guided_"), value)))
    if len(found) > 1:
        raise ApiError(400, "invalid_request", f"{found[1][0]}: only one structured output constraint per request "
                       f"({found[0][0]} is one already)", {"field": found[1][0]})
    return found[0][1] if found else None
