"""Tenant registry projection: `llm.tenants` -> tenants, api_keys."""
from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg.types.json import Jsonb

from schemas.envelope import Envelope
from schemas.registry_events import TenantRegistered
from schemas.topics import TENANTS

NAME = "tenants"


class TenantsProjection:
    name = NAME
    topic = TENANTS

    def tables(self) -> tuple[str, ...]:
        return ("tenants", "api_keys")

    def apply(self, conn: psycopg.Connection, events: Sequence[Envelope]) -> None:
        for event in events:
            if isinstance(event, TenantRegistered):
                apply(conn, event)


def apply(conn: psycopg.Connection, event: TenantRegistered) -> None:
    """Upsert the tenant's current state; its previous keys are revoked at the event's time."""
    limits = event.limits
    conn.execute(
        """
        INSERT INTO tenants (tenant_id, name, weight, max_tokens_in_flight, tokens_per_minute,
                             max_concurrency, max_queued_tokens, registered_at, billing)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (tenant_id) DO UPDATE SET
            name = EXCLUDED.name, weight = EXCLUDED.weight,
            max_tokens_in_flight = EXCLUDED.max_tokens_in_flight,
            tokens_per_minute = EXCLUDED.tokens_per_minute,
            max_concurrency = EXCLUDED.max_concurrency,
            max_queued_tokens = EXCLUDED.max_queued_tokens, billing = EXCLUDED.billing
        """,
        (event.tenant_id, event.name, limits.weight, limits.max_tokens_in_flight, limits.tokens_per_minute,
         limits.max_concurrency, limits.max_queued_tokens, event.occurred_at,
         Jsonb(event.billing.model_dump(exclude_none=True))),
    )
    conn.execute(
        "INSERT INTO api_keys (key_hash, tenant_id, key_prefix, issued_at) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (tenant_id, key_hash) DO NOTHING",
        (event.api_key_hash, event.tenant_id, event.api_key_prefix, event.occurred_at),
    )
    conn.execute(
        "UPDATE api_keys SET revoked_at = %s WHERE tenant_id = %s AND key_hash <> %s AND revoked_at IS NULL",
        (event.occurred_at, event.tenant_id, event.api_key_hash),
    )
