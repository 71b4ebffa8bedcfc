"""One codec for every topic: JSON bytes <-> typed events, with typed decode errors.

    encode(event) -> bytes            model_dump_json, UTF-8
    decode(topic, bytes) -> Event     type registry of that topic, strict validation
    record_key(topic, event) -> bytes the topic's key field
    record_headers(event)             type, and epoch / generation id where present
"""
from __future__ import annotations

import functools
import json
from typing import Annotated, Union

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from schemas.envelope import Envelope
from schemas.topics import TOPICS, spec

SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

TYPE_REGISTRY: dict[str, type[Envelope]] = {
    model.model_fields["type"].default: model for topic in TOPICS for model in topic.carries
}


class DecodeError(Exception):
    """A record that is not a valid event of its topic; `reason` says why (goes to the DLQ)."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"{topic}: {reason}")
        self.topic = topic
        self.reason = reason


class MalformedRecord(DecodeError):
    """Not UTF-8 JSON, or not a JSON object."""


class UnknownEventType(DecodeError):
    """No `type`, a type nobody declared, or a type that does not belong on this topic."""


class UnsupportedSchemaVersion(DecodeError):
    pass


class InvalidEvent(DecodeError):
    """The right type, but fields that fail validation."""


def encode(event: BaseModel) -> bytes:
    return event.model_dump_json().encode("utf-8")


@functools.cache
def _topic_adapter(topic: str) -> TypeAdapter:
    """One parse per record: a union discriminated by `type` over the topic's record types."""
    models = spec(topic).carries
    if len(models) == 1:
        return TypeAdapter(models[0])
    return TypeAdapter(Annotated[Union[models], Field(discriminator="type")])  # noqa: UP007


def decode(topic: str, data: bytes | None) -> Envelope:
    if data is not None:
        try:
            event = _topic_adapter(topic).validate_json(data)
        except ValidationError:
            pass  # the slow path below says precisely what is wrong
        else:
            # A CloudEvent (llm.usage-export) has no envelope: its `specversion` is its version.
            if getattr(event, "schema_version", 1) in SUPPORTED_SCHEMA_VERSIONS:
                return event
    return _diagnose(topic, data)


def _diagnose(topic: str, data: bytes | None) -> Envelope:
    topic_spec = spec(topic)
    if data is None:
        raise MalformedRecord(topic, "record has no value (tombstone)")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedRecord(topic, f"not UTF-8 JSON: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(raw, dict):
        raise MalformedRecord(topic, f"expected a JSON object, got {type(raw).__name__}")
    type_name = raw.get("type")
    if not isinstance(type_name, str):
        raise UnknownEventType(topic, "missing string field 'type'")
    if type_name not in topic_spec.type_names():
        known = "known elsewhere" if type_name in TYPE_REGISTRY else "unknown"
        raise UnknownEventType(topic, f"type {type_name!r} ({known}) does not belong on {topic}")
    version = raw.get("schema_version", 1)
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedSchemaVersion(topic, f"{type_name} schema_version {version!r} is not supported")
    try:
        return TYPE_REGISTRY[type_name].model_validate_json(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '<root>'}: {err['msg']}"
                             for err in exc.errors()[:5])
        raise InvalidEvent(topic, f"invalid {type_name}: {problems}") from None


def record_key(topic: str, event: BaseModel) -> bytes:
    """The topic's key field; a record that is not about one item of that kind (a period marker on
    `llm.generations`) names its own `record_key`."""
    field = spec(topic).key_field
    value = getattr(event, field) if hasattr(event, field) else getattr(event, "record_key")
    return str(value).encode("utf-8")


def record_headers(event: BaseModel) -> list[tuple[str, bytes]]:
    headers = [("type", str(getattr(event, "type")).encode())]
    for field in ("generation_id", "epoch"):
        value = getattr(event, field, None)
        if value is not None:
            headers.append((field.replace("_", "-"), str(value).encode()))
    return headers
