"""The envelope every record on every topic carries.

Values are frozen, strict pydantic models: a record is a fact, it never
changes after it is made, and a field of the wrong type is an error, not a
coercion. `extra="forbid"` turns a renamed field into a decode error instead
of a silently dropped value.
"""
from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

from pydantic import BaseModel, ConfigDict, Field


def utc_now() -> datetime:
    return datetime.now(UTC)


class Value(BaseModel):
    """A frozen, strict value nested inside an event."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class Envelope(Value):
    """Fields common to every record: identity for dedup, type, version, time."""

    event_id: UUID = Field(default_factory=uuid4)
    type: str
    schema_version: int = 1
    occurred_at: datetime = Field(default_factory=utc_now)


class TenantScoped(Envelope):
    tenant_id: str = Field(min_length=1, max_length=128)


class GenerationScoped(TenantScoped):
    """A record about one generation; `epoch` names the attempt where one exists."""

    generation_id: str = Field(min_length=1, max_length=128)
    epoch: int | None = Field(default=None, ge=1)
