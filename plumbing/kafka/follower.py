"""Follow whole topics (every partition, no consumer group) into memory.

Registries (workers, models, tenants) are compacted topics small enough to
hold in full: a follower reads them from the beginning, reports when it has
reached the end offsets seen at start (`caught_up`), and keeps following.
`read_through` says up to which wall-clock time it has read everything: a
reader that judges liveness from heartbeats must judge it as of that time, not
as of now, or its own lag (a starved process, a frozen broker) reads as the
silence of the workers it follows.
The stream bridge follows `llm.tokens` / `llm.generations` from positions it
chooses per partition (where the projections stand), also reporting `caught_up`.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import murmur2

from plumbing.kafka.clients import LONG_POLL_MS, Kafka, make_consumer, partitions_of
from schemas.codec import DecodeError, decode
from schemas.envelope import Envelope

log = logging.getLogger(__name__)

Handler = Callable[[str, Envelope], None]
# Where to start each partition: called once at start with the consumer and every assigned partition.
StartPositions = Callable[[AIOKafkaConsumer, list[TopicPartition]], Awaitable[dict[TopicPartition, int]]]


def partition_for(key: str, partitions: int) -> int:
    """The partition the Java client's default partitioner (and aiokafka's) gives `key`."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


# For registries that change a few times a day (models, tenants, presence) and whose read-through time nobody
# judges: the first new record still answers a fetch at once, and an idle follower asks the broker every 5 s,
# not twice a second. Not for `llm.workers`: liveness is judged as of its read-through time.
REGISTRY_POLL_MS = 5000


class Follower:
    def __init__(self, kafka: Kafka, topics: list[str], handler: Handler,
                 start: Literal["beginning", "end"] | StartPositions = "beginning",
                 client_id: str = "ledgerlm-follower",
                 after_batch: Callable[[], None] | None = None, long_poll_ms: int = LONG_POLL_MS) -> None:
        self.topics = topics
        self.handler = handler
        self.after_batch = after_batch  # called once per fetched batch, after its records' handlers
        self.start_at = start
        self.kafka = kafka
        self.client_id = client_id
        self.long_poll_ms = long_poll_ms  # how long the broker holds a fetch that finds nothing new
        self.consumer: AIOKafkaConsumer | None = None  # made in start(): aiokafka needs the running loop
        self.caught_up = asyncio.Event()
        self._ends: dict[TopicPartition, int] = {}
        self.freshness = ReadThrough()

    async def start(self) -> None:
        self.consumer = make_consumer(self.kafka, client_id=self.client_id, auto_offset_reset="latest",
                                      fetch_max_wait_ms=self.long_poll_ms)
        await self.consumer.start()
        partitions = [tp for topic in self.topics for tp in await partitions_of(self.consumer, topic)]
        self.consumer.assign(partitions)
        if self.start_at == "beginning":
            await self.consumer.seek_to_beginning(*partitions)
            self._ends = await self.consumer.end_offsets(partitions)
        elif callable(self.start_at):
            positions = await self.start_at(self.consumer, partitions)
            self._ends = await self.consumer.end_offsets(partitions)
            for tp in partitions:
                self.consumer.seek(tp, positions[tp])
        else:
            await self.consumer.seek_to_end(*partitions)
            for tp in partitions:  # resolve the lazy seek now, so nothing written after start() is missed
                await self.consumer.position(tp)
        await self._check_caught_up()

    async def _check_caught_up(self) -> None:
        if self.caught_up.is_set():
            return
        for tp, end in list(self._ends.items()):
            if await self.consumer.position(tp) >= end:
                del self._ends[tp]
        if not self._ends:
            self.caught_up.set()

    async def poll_once(self, timeout_ms: int = 200) -> None:
        batches = await self.consumer.getmany(timeout_ms=timeout_ms)
        for records in batches.values():
            for record in records:
                try:
                    event = decode(record.topic, record.value)
                except DecodeError as exc:
                    log.warning("follower skipped record topic=%s partition=%d offset=%d error=%s",
                                record.topic, record.partition, record.offset, type(exc).__name__)
                    continue
                self.handler(record.topic, event)
        if batches and self.after_batch is not None:
            self.after_batch()
        await self._check_caught_up()
        await self.freshness.note(self.consumer)

    def read_through(self) -> float | None:
        """Unix time up to which every record of every followed partition has been read (ReadThrough)."""
        return self.freshness.read_through(self.consumer)

    async def catch_up(self) -> None:
        """Read up to the end offsets seen at start (a bounded read, for one-shot tools)."""
        while not self.caught_up.is_set():
            await self.poll_once()

    async def run(self) -> None:
        while True:
            # A record ends the wait at once; an idle follower then wakes once a second, not five times.
            await self.poll_once(timeout_ms=1000)

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()


class ReadThrough:
    """Up to which wall-clock time a consumer has read its assigned partitions through.

    After each poll, `note` records for every partition read to its high watermark the time of the fetch that
    reported that watermark (aiokafka's `last_poll_timestamp`). `read_through` is the oldest of those: a record
    written before it has been handled, one written after may not have been."""

    def __init__(self) -> None:
        self.fresh_at: dict[TopicPartition, float] = {}

    async def note(self, consumer: AIOKafkaConsumer) -> None:
        for tp in consumer.assignment():
            highwater, polled_ms = consumer.highwater(tp), consumer.last_poll_timestamp(tp)
            if highwater is not None and polled_ms is not None and await consumer.position(tp) >= highwater:
                self.fresh_at[tp] = polled_ms / 1000

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Partitions (re)assigned or revoked: what an earlier assignment read says nothing of the backlog now."""
        for tp in partitions:
            self.fresh_at.pop(tp, None)

    def of(self, tp: TopicPartition) -> float | None:
        """Up to when this one partition has been read through (None: not since it was assigned)."""
        return self.fresh_at.get(tp)

    def read_through(self, consumer: AIOKafkaConsumer | None) -> float | None:
        """None before every assigned partition has been read through once."""
        assigned = consumer.assignment() if consumer is not None else set()
        if not assigned or any(tp not in self.fresh_at for tp in assigned):
            return None
        return min(self.fresh_at[tp] for tp in assigned)
