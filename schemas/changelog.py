"""Controller state on the compacted `llm.control-changelog` (co-partitioned with commands by tenant).

Records are written to the partition of the tenant's `llm.commands` partition
(explicitly, not by hashing their key), and keyed so compaction keeps the
latest record per item:

    IdentityRecorded    "<plane>/<tenant>/g/<request id>"   one per generation, latest state
    TenantBudgetState   "<plane>/<tenant>/budget"           token-rate window of the tenant
    HeldAttempt         "<plane>/<tenant>/h/<generation id>" a batch attempt admitted, not yet dispatched
                                                            (tombstoned when dispatched, canceled or expired)

`plane` is the controller group that wrote the record: a controller rebuilds
only its own plane's records, so two control planes sharing a broker never
adopt (and expire) each other's generations.

An ended generation's identity is forgotten `identity_ttl_s` after its end
(`ended_at`): the controller writes a tombstone (a null value) under its key
in the same transaction as its decision, so a rebuild forgets it too and
compaction finally drops both. After that the request id is a new request.

Tokens in flight and concurrency are not stored separately: they are the sums
over a tenant's live generations, so a rebuild cannot disagree with them.
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from schemas.envelope import TenantScoped
from schemas.values import SamplingParams, Tier

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
    ended_at: datetime | None = None  # when it ended (log time): its identity expires identity_ttl_s later
    plane: str | None = None

    @property
    def changelog_key(self) -> str:
        return identity_key(self.plane, self.tenant_id, self.request_id)


def identity_key(plane: str | None, tenant_id: str, request_id: str) -> str:
    return f"{plane or '-'}/{tenant_id}/g/{request_id}"


def identity_of_key(key: str, plane: str | None) -> tuple[str, str] | None:
    """(tenant id, request id) named by an identity key of `plane`; None for another plane's or a budget key.
    Tenant ids are slugs (no "/"); a request id may hold any printable character, "/" included."""
    return item_of_key(key, plane, "g")


def item_of_key(key: str, plane: str | None, kind: str) -> tuple[str, str] | None:
    """(tenant id, item) of a key "<plane>/<tenant>/<kind>/<item>" of `plane`; None for any other key."""
    prefix = f"{plane or '-'}/"
    if not key.startswith(prefix):
        return None
    tenant_id, sep, rest = key[len(prefix):].partition("/")
    marker = f"{kind}/"
    if not sep or not rest.startswith(marker) or len(rest) == len(marker):
        return None
    return tenant_id, rest[len(marker):]


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


class HeldAttempt(TenantScoped):
    """A batch attempt the controller accepted and holds until a worker has room for it: everything its
    `StartAttempt` needs, so a controller that takes the partition over dispatches it as the first would."""

    type: Literal["HeldAttempt"] = "HeldAttempt"
    request_id: str = Field(min_length=1)
    generation_id: str = Field(min_length=1)
    epoch: int = Field(ge=1)
    model_version: str = Field(min_length=1)
    input_token_ids: tuple[int, ...]
    max_output_tokens: int = Field(ge=1)
    sampling: SamplingParams = SamplingParams()
    weight: float = Field(default=1.0, gt=0.0)
    held_at: datetime  # when it was admitted (or handed back): the queue's order
    expires_at: datetime  # the end of its completion window
    plane: str | None = None

    @property
    def changelog_key(self) -> str:
        return held_key(self.plane, self.tenant_id, self.generation_id)

    @property
    def output_tokens(self) -> int:
        return self.max_output_tokens * self.sampling.n


def held_key(plane: str | None, tenant_id: str, generation_id: str) -> str:
    return f"{plane or '-'}/{tenant_id}/h/{generation_id}"


def held_of_key(key: str, plane: str | None) -> str | None:
    """The generation id named by a held-attempt key of `plane` (None for any other key)."""
    item = item_of_key(key, plane, "h")
    return item[1] if item is not None else None
