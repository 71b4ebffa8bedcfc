"""Creating a tenant is an event: publish TenantRegistered, then project it into Postgres.

Changing one is the same event again: `llm.tenants` is compacted by tenant id and each TenantRegistered is
the tenant's whole state, so a change republishes the latest record from the log with the field changed
(a partial event there would, once compacted, be all that is left of the tenant).
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

import psycopg

from plumbing.kafka.clients import Kafka, make_consumer, make_producer, partitions_of, publish, read_to_end
from plumbing.kafka.dead_letters import DeadLetterRouter
from producers.api_keys import issue_api_key
from projections.runtime import Projector
from projections.tenants import TenantsProjection
from schemas.codec import DecodeError, decode
from schemas.envelope import utc_now
from schemas.registry_events import TenantRegistered
from schemas.topics import TENANTS
from schemas.values import BillingIds, TenantLimits

TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class TenantExists(Exception):
    pass


class InvalidTenantName(ValueError):
    pass


class UnknownTenant(LookupError):
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
        await record_tenant(kafka, database_url, event)
    return CreatedTenant(tenant_id=name, api_key=key.plain)


async def record_tenant(kafka: Kafka, database_url: str, event: TenantRegistered) -> None:
    """Publish a tenant's record to `llm.tenants`, then project it, so the caller reads it back at once."""
    producer = make_producer(kafka)
    await producer.start()
    try:
        await publish(producer, TENANTS, event)
    finally:
        await producer.stop()
    await project_tenants(kafka, database_url)


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


async def latest_registration(kafka: Kafka, tenant_id: str) -> TenantRegistered | None:
    """The tenant's latest TenantRegistered on `llm.tenants`, read to its end as of now (None: no such tenant)."""
    consumer = make_consumer(kafka, client_id="ledgerlm-tenant-admin")
    await consumer.start()
    latest = None
    try:
        tps = await partitions_of(consumer, TENANTS)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        async for _tp, records in read_to_end(consumer, tps):
            for record in records:
                if record.key is None or record.key.decode() != tenant_id:
                    continue
                try:
                    event = decode(TENANTS, record.value)
                except DecodeError:
                    continue  # the projector dead-letters it; it registers nobody
                if isinstance(event, TenantRegistered):
                    latest = event
    finally:
        await consumer.stop()
    return latest


async def set_billing(kafka: Kafka, database_url: str, tenant_id: str, *, stripe_customer_id: str | None = None,
                      lago_subscription_id: str | None = None) -> BillingIds:
    """Republish the tenant's latest registration with the given billing ids (the others as they were), and
    project it; its key and limits stay as the log has them. Returns the tenant's billing ids now."""
    latest = await latest_registration(kafka, tenant_id)
    if latest is None:
        raise UnknownTenant(f"no tenant {tenant_id!r}")
    changed = {"stripe_customer_id": stripe_customer_id, "lago_subscription_id": lago_subscription_id}
    billing = BillingIds.model_validate({**latest.billing.model_dump(),
                                         **{k: v for k, v in changed.items() if v is not None}})
    event = TenantRegistered.model_validate({**latest.model_dump(), "event_id": uuid.uuid4(),
                                             "occurred_at": utc_now(), "billing": billing})
    await record_tenant(kafka, database_url, event)
    return billing
