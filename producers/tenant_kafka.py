"""A tenant's Kafka door: its intake and results topics (schemas/intake.py), and under SASL its own principal.

    topics     llm.requests.<tenant>, llm.results.<tenant>             (always)
    principal  SCRAM-SHA-256 user `tenant-<tenant>`                     (when the admin access is SASL and
    ACLs       WRITE, DESCRIBE  llm.requests.<tenant>                    the brokers have an authorizer)
               READ, DESCRIBE   llm.results.<tenant>
               READ             consumer groups `<tenant>.*`

The principal's name carries a fixed prefix so that no tenant id can name a service principal (a tenant
called `admin` must never replace the super user's credential). The password is the caller's to keep
(`ledgerlm/tenant_credentials.py` stores it 0600); a second grant with the same one changes nothing a client
sees (a new salt), and adds no ACL twice.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import SecretStr

from plumbing.kafka.access import KafkaAccess, KafkaPrincipal
from plumbing.kafka.acls import AclBinding, KafkaSecurityError, create_acls, upsert_scram_user
from plumbing.kafka.clients import Kafka, make_admin
from plumbing.kafka.topic_admin import TopicAdmin
from schemas.intake import intake_topic, results_topic, tenant_topic_specs

PRINCIPAL_PREFIX = "tenant-"
MECHANISM = "SCRAM-SHA-256"


def tenant_principal(tenant_id: str) -> str:
    return PRINCIPAL_PREFIX + tenant_id


def tenant_acls(tenant_id: str) -> list[AclBinding]:
    user = f"User:{tenant_principal(tenant_id)}"
    return [AclBinding(user, "topic", intake_topic(tenant_id), "write"),
            AclBinding(user, "topic", intake_topic(tenant_id), "describe"),
            AclBinding(user, "topic", results_topic(tenant_id), "read"),
            AclBinding(user, "topic", results_topic(tenant_id), "describe"),
            AclBinding(user, "group", f"{tenant_id}.", "read", pattern="prefixed")]


@dataclass(frozen=True)
class KafkaGrant:
    tenant_id: str
    intake_topic: str
    results_topic: str
    created: tuple[str, ...]
    principal: str | None = None  # None: no SASL, or no authorizer (the topics are then unauthenticated)
    acls: tuple[str, ...] = ()
    bootstrap: str | None = None  # where the principal logs in

    @property
    def username(self) -> str | None:
        return self.principal.removeprefix("User:") if self.principal else None

    def as_json(self) -> dict:
        return {"tenantId": self.tenant_id, "intakeTopic": self.intake_topic, "resultsTopic": self.results_topic,
                "created": list(self.created), "principal": self.principal, "acls": list(self.acls),
                "bootstrap": self.bootstrap, "mechanism": MECHANISM if self.principal else None}


async def grant_kafka(kafka: Kafka, tenant_id: str, partitions: int | None = None,
                      replication_factor: int | None = None, password: str | None = None) -> KafkaGrant:
    """Create (or verify) the tenant's topics; given a SASL admin access and the tenant's `password`, also its
    principal and ACLs (skipped when the brokers have no authorizer). Idempotent."""
    async with TopicAdmin(kafka, partitions, replication_factor) as admin:
        report = await admin.ensure(tenant_topic_specs(tenant_id))
    if report.drift:
        raise RuntimeError(f"tenant topics drifted: {[d.__dict__ for d in report.drift]}")
    grant = KafkaGrant(tenant_id, intake_topic(tenant_id), results_topic(tenant_id), report.created)
    access = KafkaAccess.of(kafka)
    if not access.uses_sasl or password is None:
        return grant
    bindings = tenant_acls(tenant_id)
    admin = make_admin(access)
    await admin.start()
    try:
        try:
            await create_acls(admin, bindings)
        except KafkaSecurityError as exc:
            if exc.error == "SecurityDisabled":  # no authorizer: a principal would guard nothing
                return grant
            raise
        await upsert_scram_user(admin, tenant_principal(tenant_id), password)
    finally:
        await admin.close()
    return replace(grant, principal=f"User:{tenant_principal(tenant_id)}",
                   acls=tuple(b.describe() for b in bindings), bootstrap=access.bootstrap)


def tenant_access(admin_access: KafkaAccess, tenant_id: str, password: str) -> KafkaAccess:
    """The same brokers as `admin_access`, logged in as the tenant's principal."""
    return admin_access.as_principal(KafkaPrincipal(tenant_principal(tenant_id), SecretStr(password), MECHANISM))
