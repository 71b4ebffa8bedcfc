"""`llm.usage-export` (key: tenant id): one CloudEvents 1.0 structured event per sealed attempt.

The record is the CloudEvent itself, so a billing collector reads it without knowing our envelope; its `id`
is fixed by the seal (`usage:<generation id>:<epoch>`, epoch 0 for a generation sealed before any attempt),
so the same seal exported twice is the same event, which every billing system deduplicates by.
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from schemas.envelope import Value

USAGE_EVENT_TYPE = "io.ledgerlm.usage.sealed"


def usage_id(generation_id: str, epoch: int | None) -> str:
    return f"usage:{generation_id}:{epoch or 0}"


class SealedUsage(Value):
    """The billed meters of one seal, as a billing system rates them."""

    generation_id: str = Field(min_length=1, max_length=128)
    epoch: int = Field(ge=0)
    model: str = Field(min_length=1)
    label: Literal["final", "interrupted"]
    end_reason: str = Field(min_length=1)
    input_tokens: int = Field(ge=0)
    cached_input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


class UsageSealed(Value):
    """A CloudEvent in structured JSON mode: `subject` is the tenant, `time` the seal time."""

    specversion: Literal["1.0"] = "1.0"
    id: str = Field(min_length=1, max_length=200)
    source: str = Field(min_length=1)
    type: Literal["io.ledgerlm.usage.sealed"] = USAGE_EVENT_TYPE
    subject: str = Field(min_length=1, max_length=128)
    time: datetime
    datacontenttype: Literal["application/json"] = "application/json"
    data: SealedUsage
