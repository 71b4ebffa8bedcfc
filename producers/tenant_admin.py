"""Creating a tenant is an event: publish TenantRegistered, then project it into Postgres."""
from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg

from plumbing.kafka.clients import Kafka, make_producer, publish
from plumbing.kafka.dead_letters import DeadLetterRouter
from producers.api_keys import issue_api_key
from projections.runtime import Projector
from projections.tenants import TenantsProjection
from schemas.registry_events import TenantRegistered
from schemas.topics import TENANTS
from schemas.values import BillingIds, TenantLimits

TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class TenantExists(Exception):
    pass


class InvalidTenantName(ValueError):
    pass


@dataclass(frozen=True)
class CreatedTenant:
    tenant_id: str
    api_key: str


async def create_tenant(kafka: Kafka, database_url: str, name: str, limits: TenantLimits,
                        billing: BillingIds = BillingIds()) -> CreatedTenant:
    """Register a new tenant; the tenant id is its name (lowercase slug), unique by construction."""
    if not TENANT_NAME.match(name):
        raise InvalidTenantName(f"tenant name {name!r} must match {TENANT_NAME.pattern}")
    with psycopg.connect(database_url, autocommit=True) as conn:
        await project_tenants(kafka, database_url)
        if conn.execute("SELECT 1 FROM tenants WHERE tenant_id = %s", (name,)).fetchone():
            raise TenantExists(f"tenant {name!r} already exists")
        key = issue_api_key()
        event = TenantRegistered(tenant_id=name, name=name, limits=limits,
                                 api_key_hash=key.hash, api_key_prefix=key.prefix, billing=billing)
        producer = make_producer(kafka)
        await producer.start()
        try:
            await publish(producer, TENANTS, event)
        finally:
            await producer.stop()
        await project_tenants(kafka, database_url)
    return CreatedTenant(tenant_id=name, api_key=key.plain)


async def project_tenants(kafka: Kafka, database_url: str) -> int:
    """Apply `llm.tenants` up to its current end with the projector itself (a running `ledgerlm project`
    may apply the same records: compare-and-set makes one of us re-seek, not apply twice)."""
    producer = make_producer(kafka)
    await producer.start()
    router = DeadLetterRouter(producer)
    projector = Projector(kafka, database_url, [TenantsProjection()], divert=router.decode_or_divert,
                          reject=router.refused_by_projection)
    try:
        return (await projector.catch_up()).applied.get(TenantsProjection.name, 0)
    finally:
        projector.close()
        await producer.stop()
