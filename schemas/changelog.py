"""Controller state on the compacted `llm.control-changelog` (co-partitioned with commands by tenant).

Records are written to the partition of the tenant's `llm.commands` partition
(explicitly, not by hashing their key), and keyed so compaction keeps the
latest record per item:

    IdentityRecorded    "<plane>/<tenant>/g/<request id>"   one per generation, latest state
    TenantBudgetState   "<plane>/<tenant>/budget"           token-rate window of the tenant

`plane` is the controller group that wrote the record: a controller rebuilds
only its own plane's records, so two control planes sharing a broker never
adopt (and expire) each other's generations.

Tokens in flight and concurrency are not stored separately: they are the sums
over a tenant's live generations, so a rebuild cannot disagree with them.
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from schemas.envelope import TenantScoped
from schemas.values import Tier

GenerationStatus = Literal["active", "canceling", "ended"]


class IdentityRecorded(TenantScoped):
    """(tenant, request id) -> generation id, payload hash, and the generation's control state."""

    type: Literal["IdentityRecorded"] = "IdentityRecorded"
    request_id: str = Field(min_length=1)
    generation_id: str = Field(min_length=1)
    payload_hash: str = Field(min_length=64, max_length=64)
    status: GenerationStatus = "active"
    model_version: str | None = None
    tier: Tier = "interactive"
    epoch: int | None = Field(default=None, ge=1)
    worker_id: str | None = None
    reserved_tokens: int = Field(default=0, ge=0)
    input_tokens: int = Field(default=0, ge=0)
    end_reason: str | None = None
    admitted_s: int | None = None  # unix second charged in the token-rate window
    # When the current epoch's StartAttempt was decided: the attempt's age for the maximum run time, and the
    # grace a worker has to list an attempt that may still be on its way to it.
    dispatched_at: datetime | None = None
    queued: bool = False  # routed to wait for KV room on its worker (batch tier): counts as queued work
    plane: str | None = None

    @property
    def changelog_key(self) -> str:
        return f"{self.plane or '-'}/{self.tenant_id}/g/{self.request_id}"


class TenantBudgetState(TenantScoped):
    type: Literal["TenantBudgetState"] = "TenantBudgetState"
    tokens_in_flight: int = Field(ge=0)
    concurrency: int = Field(ge=0)
    queued_tokens: int = Field(ge=0)
    # (unix second, tokens) charged in the last minute: the token-rate window.
    rate_buckets: tuple[tuple[int, int], ...] = ()
    plane: str | None = None

    @property
    def changelog_key(self) -> str:
        return f"{self.plane or '-'}/{self.tenant_id}/budget"
