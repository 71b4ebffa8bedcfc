"""The stream bridge's two live readers of `llm.generations` + `llm.tokens`.

    gateway group (RangeAssignor) ──▶ OwnedReader: this gateway's share of partitions ──┐
    partitions of local subscribers                                                     ├─▶ bridge.take(records)
        owned by another gateway  ──▶ GuestReader: manually assigned, same partition ───┘

Both topics are keyed by generation id with the same partition count, so one
generation's lifecycle and tokens sit in the same-numbered partition of each.
The range assignor gives a member the same-numbered partitions of every topic
it subscribes to (aiokafka has range and round-robin, no sticky or cooperative
protocol; round-robin, aiokafka's default, would split a partition number across
gateways whenever the partition count times two is not a multiple of the gateways), so a
gateway owns whole generations. A rebalance is eager: on revoke, a partition
with a local subscriber moves to the guest reader at the exact next offset the
owner had not handled yet (no gap, no repeat); on assign, the new owner starts
where the projections stand (or where its guest reader was, if earlier).

Each reader remembers, per partition, the next offset it has not handled: the
point where a new subscriber's backfill stops and live reading takes over.

Each reader also paces its fetches (`FetchPacing`). A fetch costs aiokafka about
0.4 ms of CPU whatever it carries, and with records arriving every millisecond a
consumer answered at the first record fetches a thousand times a second however
few partitions it reads: sharing the partitions would then save the decoding but
not the fetching. So while records flow, the broker holds each fetch up to 2 ms.
"Flow" is a poll that brought BUSY_RECORDS or more, at least BUSY_RECORDS for
every FLOW_WAIT_MS it waited (800 a second). A real-model stream yields a token
every ~100 ms, and pacing it as a flow had the fetcher ask the broker every 2 ms
between two tokens (~50 empty fetches per token, in the gateway and in the
broker). A worker's step also publishes the tokens of every running stream at
once: a poll that waited ~100 ms for such a burst of 8 or 16 records is not a
flow, and pacing it as one cost ~4 empty fetches a step. After a poll of a few
records, or of a burst it waited for, the next fetch is a long poll, answered at
the first record.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from plumbing.kafka.clients import LONG_POLL_MS, Kafka, make_consumer, pace_fetches
from schemas.topics import GENERATIONS, TOKENS

log = logging.getLogger(__name__)

BRIDGE_TOPICS = (GENERATIONS, TOKENS)
Sink = Callable[[list[ConsumerRecord], bool], None]
# A reader starts a partition at an offset: (tp, offset, whether that is where the projections stand)
Started = Callable[[TopicPartition, int, bool], None]
Positions = Callable[[AIOKafkaConsumer, list[TopicPartition]], Awaitable[dict[TopicPartition, int]]]


def topic_partitions(partition: int) -> list[TopicPartition]:
    return [TopicPartition(topic, partition) for topic in BRIDGE_TOPICS]


# A poll that brings this many records (or more), and as many for every FLOW_WAIT_MS it waited, means records flow
# faster than fetches can be answered one by one: the reader then lets the broker gather 2 ms of them per fetch.
BUSY_RECORDS = 4
FLOW_WAIT_MS = 5
# How long a flowing reader waits for its next batch before it goes back to long polls: the fetcher asks the
# broker every 2 ms meanwhile, so a flow that stops costs at most a few empty fetches.
BUSY_POLL_MS = 10


class FetchPacing:
    """How long the broker may hold one consumer's fetches (min bytes, max wait), by what it reads:

        quiet  nobody wants its records, nothing came   a long poll: the first record answers it, so a party
                                                         that subscribes meanwhile waits for nothing
        idle   nobody wants its records, records come   1 MiB or 50 ms: batches of hundreds; nobody waits for them
        live   wanted, fetches of a few records          answered at the first record (a long poll): no added latency
        busy   wanted, polls that bring a flow (above)   64 KiB or 2 ms: a fetch carries what 2 ms bring, not one record

    An idle reader paced at 50 ms with no traffic at all asked the broker 20 times a second for nothing: two
    thirds of an idle gateway's fetches (`bench efficiency`, `kafka_requests_per_s`).
    """

    MODES = {"quiet": (1, LONG_POLL_MS), "idle": (1 << 20, 50), "live": (1, LONG_POLL_MS), "busy": (64 << 10, 2)}

    def __init__(self) -> None:
        self.mode = "live"  # what the consumer is made with (make_consumer's defaults)
        self.records = 0  # what the last poll brought
        self.flowing = False  # whether that was a flow: BUSY_RECORDS+, as many per FLOW_WAIT_MS waited

    def set(self, consumer: AIOKafkaConsumer | None, wanted: bool, records: int | None = None,
            waited_ms: float = 0.0) -> None:
        """Pace by whether a local party wants the records and by what the last poll brought in how long
        (None: unchanged)."""
        if records is not None:
            self.records = records
            self.flowing = records >= BUSY_RECORDS and records * FLOW_WAIT_MS >= BUSY_RECORDS * waited_ms
        if wanted:
            mode = "busy" if self.flowing else "live"
        else:
            mode = "idle" if self.records else "quiet"
        if mode != self.mode and consumer is not None:
            pace_fetches(consumer, *self.MODES[mode])
            self.mode = mode


class PartitionReader:
    owned = False

    def __init__(self, sink: Sink, after_batch: Callable[[], None], started: Started) -> None:
        self.sink = sink
        self.started = started
        self.after_batch = after_batch
        self.consumer: AIOKafkaConsumer | None = None
        self.next_offsets: dict[TopicPartition, int] = {}
        self.pacing = FetchPacing()
        self.wanted: Callable[[], bool] = lambda: True  # whether a local party wants any of its records
        self.clock: Callable[[], float] = time.monotonic

    @property
    def partitions(self) -> list[int]:
        return sorted({tp.partition for tp in self.next_offsets})

    def pace(self) -> None:
        """Re-pace after the wanted generations changed (the flow is as the last fetch found it)."""
        self.pacing.set(self.consumer, self.wanted())

    async def poll_once(self, timeout_ms: int) -> None:
        if self.pacing.mode == "busy":
            timeout_ms = min(timeout_ms, BUSY_POLL_MS)  # a flow that stops goes back to long polls at once
        asked = self.clock()
        batches = await self.consumer.getmany(timeout_ms=timeout_ms)
        waited_ms = (self.clock() - asked) * 1000
        handled = 0
        for tp, records in batches.items():
            expected = self.next_offsets.get(tp)
            if expected is None:
                continue  # fetched before the partition left this reader
            if records[0].offset < expected:  # fetched before a seek: already handled
                records = [r for r in records if r.offset >= expected]
            if records:
                self.sink(records, self.owned)
                self.next_offsets[tp] = records[-1].offset + 1
                handled += len(records)
        if handled:
            self.after_batch()
        self.pacing.set(self.consumer, self.wanted(), handled, waited_ms)

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()


class OwnedReader(PartitionReader):
    """This gateway's share of the partitions, through the gateways' consumer group."""

    owned = True

    def __init__(self, kafka: Kafka, group: str, positions: Positions, sink: Sink, after_batch: Callable[[], None],
                 started: Started,
                 on_revoked: Callable[[dict[TopicPartition, int]], Awaitable[None]],
                 on_assigned: Callable[[list[TopicPartition]], Awaitable[dict[TopicPartition, int]]]) -> None:
        super().__init__(sink, after_batch, started)
        self.kafka, self.group, self.positions = kafka, group, positions
        self.on_revoked, self.on_assigned = on_revoked, on_assigned
        self.caught_up = asyncio.Event()
        self.assigned_once = asyncio.Event()
        self.held: frozenset[int] = frozenset()  # the partition numbers owned now (checked on every poll)
        self._ends: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        self.consumer = make_consumer(self.kafka, group_id=self.group, client_id="gateway-bridge",
                                      auto_offset_reset="latest", session_timeout_ms=10000,
                                      heartbeat_interval_ms=1000,
                                      partition_assignment_strategy=(RangePartitionAssignor,))
        await self.consumer.start()
        self.consumer.subscribe(list(BRIDGE_TOPICS), listener=_Listener(self))

    async def revoked(self, tps: set[TopicPartition]) -> None:
        handed = {tp: self.next_offsets.pop(tp) for tp in tps if tp in self.next_offsets}
        self.held = frozenset(tp.partition for tp in self.next_offsets)
        await self.on_revoked(handed)

    async def assigned(self, tps: set[TopicPartition]) -> None:
        if tps:
            starts = await self.positions(self.consumer, sorted(tps))
            projected = dict(starts)
            for tp, offset in (await self.on_assigned(sorted(tps))).items():
                starts[tp] = min(starts[tp], offset)  # the guest reader's position, where it is earlier
            for tp in tps:
                self.consumer.seek(tp, starts[tp])
                self.next_offsets[tp] = starts[tp]
                self.started(tp, starts[tp], starts[tp] <= projected[tp])
            self.held = frozenset(tp.partition for tp in self.next_offsets)
            if not self.assigned_once.is_set():
                self._ends = {tp: end for tp, end in (await self.consumer.end_offsets(sorted(tps))).items()}
        log.info("bridge owns partitions=%s", sorted({tp.partition for tp in tps}))
        self.assigned_once.set()

    async def poll_once(self, timeout_ms: int) -> None:
        await super().poll_once(timeout_ms)
        if not self.caught_up.is_set() and self.assigned_once.is_set():
            await self._check_caught_up()

    async def _check_caught_up(self) -> None:
        """Caught up: every partition of the first assignment read to the end it had then (or moved away)."""
        remaining = {}
        for tp, end in self._ends.items():
            try:
                behind = tp in self.next_offsets and await self.consumer.position(tp) < end
            except Exception:  # noqa: BLE001 - revoked while asking: no longer ours to read
                behind = False
            if behind:
                remaining[tp] = end
        self._ends = remaining
        if not remaining:
            self.caught_up.set()


class _Listener(ConsumerRebalanceListener):
    def __init__(self, reader: OwnedReader) -> None:
        self.reader = reader

    async def on_partitions_revoked(self, revoked) -> None:
        await self.reader.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned) -> None:
        await self.reader.assigned(set(assigned))


class GuestReader(PartitionReader):
    """Partitions another gateway owns, followed only while a local subscriber needs one of their generations."""

    def __init__(self, kafka: Kafka, sink: Sink, after_batch: Callable[[], None], started: Started) -> None:
        super().__init__(sink, after_batch, started)
        self.kafka = kafka
        self.changed = asyncio.Event()
        self.lock = asyncio.Lock()

    async def start(self) -> None:
        self.consumer = make_consumer(self.kafka, client_id="gateway-bridge-guest", auto_offset_reset="latest")
        await self.consumer.start()

    async def follow(self, starts: dict[TopicPartition, int | None]) -> dict[TopicPartition, int]:
        """Follow these partitions from these offsets (None: the end now); returns where each starts."""
        async with self.lock:
            wanted = {tp: start for tp, start in starts.items() if tp not in self.next_offsets}
            if not wanted:
                return {tp: self.next_offsets[tp] for tp in starts}
            self.consumer.assign([*self.next_offsets, *wanted])  # a new assignment forgets every position
            for tp, offset in self.next_offsets.items():
                self.consumer.seek(tp, offset)
            for tp, start in wanted.items():
                if start is None:
                    await self.consumer.seek_to_end(tp)
                    start = await self.consumer.position(tp)
                else:
                    self.consumer.seek(tp, start)
                self.next_offsets[tp] = start
                self.started(tp, start, False)  # where the owner stopped: what is held goes on
            log.info("bridge guest follows partitions=%s", self.partitions)
            self.changed.set()
            return {tp: self.next_offsets[tp] for tp in starts}

    async def release(self, partition: int) -> dict[TopicPartition, int]:
        """Stop following `partition`; returns where it stood."""
        async with self.lock:
            left = {tp: self.next_offsets.pop(tp) for tp in topic_partitions(partition) if tp in self.next_offsets}
            if left:
                self.consumer.assign(list(self.next_offsets))
                for tp, offset in self.next_offsets.items():
                    self.consumer.seek(tp, offset)
            return left

    async def poll_once(self, timeout_ms: int) -> None:
        if not self.next_offsets:
            self.changed.clear()
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    await self.changed.wait()
            except TimeoutError:
                pass
            return
        async with self.lock:
            await super().poll_once(min(timeout_ms, 100))  # short: a new subscriber's assignment waits for it
