"""Compacted registries: workers (`llm.workers`), model versions (`llm.models`), tenants (`llm.tenants`)."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from schemas.envelope import Envelope
from schemas.values import TenantLimits


class WorkerHeartbeat(Envelope):
    type: Literal["WorkerHeartbeat"] = "WorkerHeartbeat"
    worker_id: str = Field(min_length=1)
    model_versions: tuple[str, ...]
    total_blocks: int = Field(ge=0)
    free_blocks: int = Field(ge=0)
    block_size: int = Field(ge=1)
    running: int = Field(ge=0)
    queued_tokens: int = Field(ge=0)
    draining: bool = False
    lease_ms: int = Field(default=5000, ge=1)


class ModelVersionRegistered(Envelope):
    """An immutable model version: what the files are (checksums) and what it can hold."""

    type: Literal["ModelVersionRegistered"] = "ModelVersionRegistered"
    model_version: str = Field(min_length=1)
    name: str = Field(min_length=1)
    checksums: dict[str, str]
    max_context_tokens: int = Field(ge=1)
    kv_bytes_per_token: int = Field(ge=1)
    registered_at: datetime


class TenantRegistered(Envelope):
    """A tenant's full current state (snapshot, so compaction keeps the latest).

    Only the SHA-256 of the API key travels; the key itself is shown once by the CLI.
    """

    type: Literal["TenantRegistered"] = "TenantRegistered"
    tenant_id: str = Field(min_length=1, max_length=128)
    name: str = Field(min_length=1, max_length=128)
    limits: TenantLimits
    api_key_hash: str = Field(min_length=64, max_length=64)
    api_key_prefix: str = Field(min_length=1, max_length=32)
