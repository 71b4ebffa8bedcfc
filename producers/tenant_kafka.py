"""A tenant's Kafka door: its intake and results topics (schemas/intake.py), created on the brokers."""
from __future__ import annotations

from dataclasses import dataclass

from plumbing.kafka.clients import Kafka
from plumbing.kafka.topic_admin import TopicAdmin
from schemas.intake import intake_topic, results_topic, tenant_topic_specs


@dataclass(frozen=True)
class KafkaGrant:
    tenant_id: str
    intake_topic: str
    results_topic: str
    created: tuple[str, ...]

    def as_json(self) -> dict:
        return {"tenantId": self.tenant_id, "intakeTopic": self.intake_topic, "resultsTopic": self.results_topic,
                "created": list(self.created)}


async def grant_kafka(kafka: Kafka, tenant_id: str, partitions: int | None = None,
                      replication_factor: int | None = None) -> KafkaGrant:
    """Create (or verify) the tenant's `llm.requests.<tenant>` and `llm.results.<tenant>`; idempotent."""
    async with TopicAdmin(kafka, partitions, replication_factor) as admin:
        report = await admin.ensure(tenant_topic_specs(tenant_id))
    if report.drift:
        raise RuntimeError(f"tenant topics drifted: {[d.__dict__ for d in report.drift]}")
    return KafkaGrant(tenant_id, intake_topic(tenant_id), results_topic(tenant_id), report.created)
