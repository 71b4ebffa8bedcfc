"""Controller state on the compacted `llm.control-changelog` (co-partitioned with commands by tenant)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.envelope import TenantScoped


class IdentityRecorded(TenantScoped):
    """(tenant, request id) -> generation id and the payload hash that makes a repeat idempotent."""

    type: Literal["IdentityRecorded"] = "IdentityRecorded"
    request_id: str = Field(min_length=1)
    generation_id: str = Field(min_length=1)
    payload_hash: str = Field(min_length=64, max_length=64)
    status: Literal["active", "ended"] = "active"


class TenantBudgetState(TenantScoped):
    type: Literal["TenantBudgetState"] = "TenantBudgetState"
    tokens_in_flight: int = Field(ge=0)
    concurrency: int = Field(ge=0)
    queued_tokens: int = Field(ge=0)
