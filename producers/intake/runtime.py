"""The intake role: every tenant's `llm.requests.<tenant>` in one consumer group, N instances.

    subscribe(pattern llm.requests.*) ─▶ Lane per partition (window of concurrent submissions)
    every poll: contiguous done prefix of each lane ─▶ one Kafka transaction:
                refusal results (llm.results.<tenant>) + dead letters + the consumed offsets

Offsets are only ever committed inside that transaction, after the outcome of every record below them is
durable (see lanes.py), so a killed instance neither loses a request (its uncommitted records are read
again by whoever owns the partition next) nor duplicates one (a resubmission is the same generation, and a
refusal is written exactly with its offset). A lane that is full is paused, so a tenant whose batch waits
on its budget holds its records in the log, not in memory.
"""
from __future__ import annotations

import asyncio
import logging
import uuid

from aiokafka import ConsumerRebalanceListener, TopicPartition

from plumbing.kafka.clients import Kafka, make_consumer, make_producer
from plumbing.kafka.follower import REGISTRY_POLL_MS, Follower
from plumbing.settings import Settings
from producers.gateway.admission.client import AdmissionClient
from producers.gateway.admission.prompts import ModelCatalog
from producers.intake.lanes import Lane, Outcome
from producers.intake.submitter import Submitter
from schemas.codec import encode, record_headers
from schemas.dead_letter import DeadLetter
from schemas.intake import INTAKE_PATTERN, GenerationResult, results_topic
from schemas.registry_events import TenantRegistered
from schemas.topics import DLQ, MODELS, TENANTS

log = logging.getLogger(__name__)

WINDOW = 64  # submissions in flight per partition


def intake_group(settings: Settings) -> str:
    return f"{settings.controller_group}-intake"


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, intake: "Intake") -> None:
        self.intake = intake

    async def on_partitions_revoked(self, revoked):
        await self.intake.release(list(revoked))

    async def on_partitions_assigned(self, assigned):
        log.info("intake owns partitions=%d topics=%d", len(assigned), len({tp.topic for tp in assigned}))


class Intake:
    def __init__(self, settings: Settings, kafka: Kafka, instance_id: str | None = None,
                 window: int = WINDOW, pattern: str = INTAKE_PATTERN) -> None:
        self.settings, self.kafka, self.window, self.pattern = settings, kafka, window, pattern
        self.instance_id = instance_id or f"intake-{uuid.uuid4().hex[:8]}"
        self.group = intake_group(settings)
        self.tenants: dict = {}
        self.catalog = ModelCatalog()
        self.registries = Follower(kafka, [TENANTS, MODELS], self._on_registry, client_id=f"{self.instance_id}-reg",
                                   long_poll_ms=REGISTRY_POLL_MS)
        self.admission = AdmissionClient(kafka, settings.controller_group, gateway_id=self.instance_id)
        self.submitter = Submitter(settings, self.admission, self.catalog, self.tenants)
        self.lanes: dict[TopicPartition, Lane] = {}
        self.lock = asyncio.Lock()
        self.ready = asyncio.Event()

    def _on_registry(self, topic: str, event) -> None:
        if isinstance(event, TenantRegistered):
            self.tenants[event.tenant_id] = event.limits
        elif topic == MODELS:
            self.catalog.observe(event)

    async def run(self) -> None:
        await self.registries.start()
        await self.registries.catch_up()
        follow = asyncio.create_task(self.registries.run(), name="intake-registries")
        await self.admission.start()
        # A stable transactional id per instance: a restarted instance fences its predecessor's open transaction.
        self.producer = make_producer(self.kafka, transactional_id=f"{self.group}-{self.instance_id}",
                                      client_id=self.instance_id)
        await self.producer.start()
        self.consumer = make_consumer(self.kafka, group_id=self.group, client_id=self.instance_id,
                                      metadata_max_age_ms=5000)
        self.consumer.subscribe(pattern=self.pattern, listener=_Rebalance(self))
        await self.consumer.start()
        log.info("intake started instance=%s group=%s", self.instance_id, self.group)
        self.ready.set()
        try:
            while True:
                await self._poll_once()
        finally:
            follow.cancel()
            for lane in self.lanes.values():
                lane.cancel()
            await self.consumer.stop()
            await self.producer.stop()
            await self.admission.stop()
            await self.registries.stop()

    async def _poll_once(self) -> None:
        batches = await self.consumer.getmany(timeout_ms=200, max_records=self.window * 4)
        async with self.lock:
            for tp, records in batches.items():
                lane = self.lanes.get(tp)
                if lane is None:
                    lane = self.lanes[tp] = Lane(self.submitter.process, self.window)
                for record in records:
                    lane.add(record)
            for tp, lane in self.lanes.items():
                if tp not in self.consumer.assignment():
                    continue
                if lane.full:
                    self.consumer.pause(tp)
                else:
                    self.consumer.resume(tp)
            await self._commit(list(self.lanes))

    async def _commit(self, tps: list[TopicPartition]) -> None:
        """One transaction: the refusals and dead letters of every lane's done prefix, and their offsets."""
        offsets: dict[TopicPartition, int] = {}
        outcomes: list[Outcome] = []
        for tp in tps:
            ready, offset = self.lanes[tp].take_ready()
            if offset is not None:
                offsets[tp] = offset
                outcomes += ready
        if not offsets:
            return
        async with self.producer.transaction():
            for outcome in outcomes:
                if isinstance(outcome, GenerationResult):
                    await self.producer.send(results_topic(outcome.tenant_id), outcome.encode(),
                                             key=outcome.request_id.encode())
                elif isinstance(outcome, DeadLetter):
                    await self.producer.send(DLQ, encode(outcome), key=outcome.source_topic.encode(),
                                             headers=record_headers(outcome))
            await self.producer.send_offsets_to_transaction(offsets, self.group)

    async def release(self, revoked: list[TopicPartition]) -> None:
        """A partition leaves: commit what is done, drop what is not (its next owner submits it again)."""
        async with self.lock:
            mine = [tp for tp in revoked if tp in self.lanes]
            await self._commit(mine)
            for tp in mine:
                self.lanes.pop(tp).cancel()
