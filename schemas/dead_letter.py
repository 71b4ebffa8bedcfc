"""`llm.dlq` (key: source topic): records that could not be decoded or were invalid."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.envelope import Envelope


class DeadLetter(Envelope):
    type: Literal["DeadLetter"] = "DeadLetter"
    source_topic: str
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)
    key_b64: str | None = None
    error_class: str
    reason: str
    payload_b64: str
