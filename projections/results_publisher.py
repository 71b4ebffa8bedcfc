"""Publishes `llm.results.<tenant>` from `llm.generations` + `llm.tokens` (projections/results.py).

    group <plane>-results, range assignor: partition p of both topics to one member (co-partitioned)
    every poll ─▶ one Kafka transaction: the results that ended + offsets, each committed as
                  (safe start, metadata "through=<position>")

A result needs the text of the whole generation, so the committed offset of a partition is its *safe start*:
the first record of the oldest generation still open there (or the position when none is). A restarted owner
reads again from there, rebuilding the open generations, and writes no result whose `Admitted` and end
both lie below the `through` positions it committed with them: the earlier owner had read both, so that
result went out in the same transaction as those offsets. (The end alone below `through` is not enough:
the two topics are fetched apart, so the earlier owner may have read an end whose `Admitted` it had not
reached, and held it.) So a crash loses no result and repeats none. Only tenants with a results topic get results (`tenants
grant-kafka`); the broker does not create topics on first write.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from plumbing.kafka.clients import Kafka, make_consumer, make_producer
from plumbing.settings import Settings
from projections.results import ResultsDeriver
from schemas.codec import DecodeError, decode
from schemas.intake import RESULTS_PREFIX, GenerationResult, results_topic
from schemas.lifecycle import Admitted
from schemas.topics import GENERATIONS, TOKENS

log = logging.getLogger(__name__)

TOPICS_REFRESH_S = 5.0


def results_group(settings: Settings) -> str:
    return f"{settings.controller_group}-results"


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, publisher: "ResultsPublisher") -> None:
        self.publisher = publisher

    async def on_partitions_revoked(self, revoked):
        self.publisher.forget()

    async def on_partitions_assigned(self, assigned):
        await self.publisher.resume(list(assigned))


class ResultsPublisher:
    def __init__(self, settings: Settings, kafka: Kafka, instance_id: str | None = None) -> None:
        self.settings, self.kafka = settings, kafka
        self.instance_id = instance_id or f"results-{uuid.uuid4().hex[:8]}"
        self.group = results_group(settings)
        self.deriver = ResultsDeriver()
        self.first_offsets: dict[str, dict[TopicPartition, int]] = {}  # open generation -> where it starts
        self.closing: dict[str, dict[str, tuple[TopicPartition, int]]] = {}  # open -> its Admitted's, its end's
        self.through: dict[TopicPartition, int] = {}  # what the earlier owner had read when it committed
        self.results_topics: set[str] = set()
        self._topics_at = 0.0
        self.published = 0
        self.ready = asyncio.Event()

    def forget(self) -> None:
        self.deriver, self.first_offsets, self.closing, self.through = ResultsDeriver(), {}, {}, {}

    async def resume(self, assigned: list[TopicPartition]) -> None:
        """Seek each partition to its safe start; remember how far its results were published."""
        self.forget()
        committed = await self.consumer._coordinator.fetch_committed_offsets(assigned)  # noqa: SLF001 (metadata)
        for tp in assigned:
            meta = committed.get(tp)
            if meta is None or meta.offset < 0:
                await self.consumer.seek_to_end(tp) if self.settings.controller_start == "latest" else \
                    await self.consumer.seek_to_beginning(tp)
                continue
            self.consumer.seek(tp, meta.offset)
            if meta.metadata.startswith("through="):
                self.through[tp] = int(meta.metadata.removeprefix("through="))
        log.info("results publisher owns partitions=%d", len(assigned))

    async def run(self) -> None:
        self.producer = make_producer(self.kafka, transactional_id=f"{self.group}-{self.instance_id}",
                                      client_id=self.instance_id)
        await self.producer.start()
        self.consumer = make_consumer(self.kafka, group_id=self.group, client_id=self.instance_id,
                                      partition_assignment_strategy=(RangePartitionAssignor,))
        self.consumer.subscribe([GENERATIONS, TOKENS], listener=_Rebalance(self))
        await self.consumer.start()
        self.ready.set()
        try:
            while True:
                await self._poll_once()
        finally:
            await self.consumer.stop()
            await self.producer.stop()

    async def _refresh_topics(self) -> None:
        if time.monotonic() - self._topics_at < TOPICS_REFRESH_S:
            return
        cluster = await self.consumer._client.fetch_all_metadata()  # noqa: SLF001
        self.results_topics = {t for t in cluster.topics() if t.startswith(RESULTS_PREFIX)}
        self._topics_at = time.monotonic()

    async def _poll_once(self) -> None:
        batches = await self.consumer.getmany(timeout_ms=500)
        if not batches:
            return
        await self._refresh_topics()
        results: list[GenerationResult] = []
        for tp, records in batches.items():
            for record in records:
                try:
                    event = decode(record.topic, record.value)
                except DecodeError:
                    continue  # the projector dead-letters it; a result has nothing to take from it
                result = self.observe(tp, record.offset, event)
                if result is not None:
                    results.append(result)
        for gid in self.deriver.sweep():
            self.first_offsets.pop(gid, None)
            self.closing.pop(gid, None)
        await self._commit(results)

    def observe(self, tp: TopicPartition, offset: int, event) -> GenerationResult | None:
        """The result this record completes, unless the earlier owner already published it."""
        gid = getattr(event, "generation_id", None)
        result = self.deriver.observe(event)
        gen = self.deriver.open.get(gid)
        if gen is not None:
            self.first_offsets.setdefault(gid, {}).setdefault(tp, offset)
            self._mark(gid, tp, offset, event, ended=gen.ended is not None)
            return None
        self.first_offsets.pop(gid, None)
        if result is None:
            return None
        self._mark(gid, tp, offset, event, ended=True)
        closing = self.closing.pop(gid, {})
        published = len(closing) == 2 and all(at < self.through.get(where, 0) for where, at in closing.values())
        return None if published else result

    def _mark(self, gid: str, tp: TopicPartition, offset: int, event, *, ended: bool) -> None:
        marks = self.closing.setdefault(gid, {})
        if isinstance(event, Admitted):
            marks.setdefault("admitted", (tp, offset))
        elif ended:
            marks.setdefault("end", (tp, offset))

    async def _commit(self, results: list[GenerationResult]) -> None:
        offsets = {}
        for tp in self.consumer.assignment():
            position = await self.consumer.position(tp)
            starts = [first[tp] for first in self.first_offsets.values() if tp in first]
            offsets[tp] = (min(starts, default=position), f"through={position}")
        async with self.producer.transaction():
            for result in results:
                topic = results_topic(result.tenant_id)
                if topic not in self.results_topics:
                    await self._refresh_topics_now()
                if topic in self.results_topics:
                    await self.producer.send(topic, result.encode(), key=result.request_id.encode())
                    self.published += 1
            await self.producer.send_offsets_to_transaction(offsets, self.group)

    async def _refresh_topics_now(self) -> None:
        self._topics_at = 0.0
        await self._refresh_topics()
