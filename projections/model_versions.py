"""llm.models -> model_versions (immutable: the first record of a version wins)."""
from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg.types.json import Jsonb

from schemas.envelope import Envelope
from schemas.registry_events import ModelVersionRegistered
from schemas.topics import MODELS


class ModelVersionsProjection:
    name = "models"
    topic = MODELS

    def tables(self) -> tuple[str, ...]:
        return ("model_versions",)

    def apply(self, conn: psycopg.Connection, events: Sequence[Envelope]) -> None:
        for e in events:
            if isinstance(e, ModelVersionRegistered):
                conn.execute(
                    "INSERT INTO model_versions (model_version, name, checksums, max_context_tokens, "
                    "kv_bytes_per_token, registered_at) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (e.model_version, e.name, Jsonb(dict(sorted(e.checksums.items()))), e.max_context_tokens,
                     e.kv_bytes_per_token, e.registered_at))
