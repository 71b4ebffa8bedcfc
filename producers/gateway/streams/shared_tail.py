"""How a gateway reads its share of the token stream and nothing else it does not need.

    owned partitions (group share) ──▶ lifecycle and final stream event of every generation: decoded
                                       tokens: decoded if someone here watches the generation, else skipped
    another gateway's partition    ──▶ followed (guest) only while a local subscriber needs it; its
                                       generation's records decoded, every other one skipped

A skipped record costs a set lookup on its key (the generation id): no JSON is
decoded. When a generation gets its first local subscriber, the records skipped
so far are read back (`backfill.py`) before anything is served, so a stream
attached on any gateway, owner or not, is the same stream.

With `share=False` (the benchmark's baseline) the gateway is the only member of
its own group and decodes everything: every gateway reads the whole log.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from plumbing.kafka.clients import Kafka, partitions_of
from plumbing.kafka.follower import StartPositions
from producers.gateway.streams.backfill import Backfill
from producers.gateway.streams.interest import Interest
from producers.gateway.streams.readers import GuestReader, OwnedReader, topic_partitions
from producers.gateway.streams.recent import RecentRecords
from schemas.codec import DecodeError, decode
from schemas.commands import StreamShare
from schemas.envelope import Envelope
from schemas.topics import GENERATIONS, TOKENS

log = logging.getLogger(__name__)

FIRST_SHARE_WAIT_S = 30.0
GUEST_LINGER_S = 10.0  # a partition nobody here watches any more is followed this long (a resume comes back)


def is_final(record: ConsumerRecord) -> bool:
    """A stream's final event, told by its `type` header (written first: `schemas.codec.record_headers`)."""
    headers = record.headers
    return bool(headers) and headers[0][1] == b"StreamFinished"


async def from_the_end(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    return await consumer.end_offsets(tps)


class Views(Protocol):
    """What the tail feeds (the bridge's generation views), named here so the tail needs nothing of the
    bridge that owns it."""

    def on_event(self, topic: str, event: Envelope, wanted: bool = True) -> None: ...

    def notify_changed(self) -> None: ...

    def backfilled(self, generation_id: str, events: list[tuple[str, Envelope]]) -> None: ...

    def unwatched(self, generation_id: str) -> None: ...


class SharedTail:
    def __init__(self, kafka: Kafka, bridge: Views, start: StartPositions | None, group: str,
                 share: bool) -> None:
        self.bridge = bridge
        self.interest = Interest()
        self.decode_all = not share
        group = group if share else f"{group}-alone-{uuid.uuid4().hex[:8]}"
        self.recent = RecentRecords()
        self.owned = OwnedReader(kafka, group, start or from_the_end, self.take, bridge.notify_changed,
                                 self.recent.start, self._moved_away, self._moved_here)
        self.guest = GuestReader(kafka, self.take, bridge.notify_changed, self.recent.start)
        self.backfill = Backfill(kafka, start)
        # The owned reader's fetches are paced idle while nobody here watches a generation of its partitions.
        self.owned.wanted = lambda: self.decode_all or not self.interest.by_partition.keys().isdisjoint(self.owned.held)
        self.decoded = 0
        self.skipped = 0
        self._filling: dict[str, asyncio.Future] = {}
        self._idle_since: dict[int, float] = {}

    async def start(self) -> None:
        await self.guest.start()
        counts = {topic: len(await partitions_of(self.guest.consumer, topic)) for topic in (TOKENS, GENERATIONS)}
        if counts[TOKENS] != counts[GENERATIONS]:
            raise RuntimeError(f"{TOKENS} and {GENERATIONS} must have the same partition count (co-partitioned "
                               f"by generation id); found {counts}")
        self.interest.partitions = counts[TOKENS]
        await self.backfill.start()
        await self.owned.start()

    def tasks(self) -> list[asyncio.Task]:
        return [asyncio.create_task(self._loop(self.owned, 1000), name="bridge-owned"),
                asyncio.create_task(self._loop(self.guest, 1000), name="bridge-guest")]

    async def first_share(self) -> None:
        """Wait (bounded) for the group's first assignment: until then this gateway reads nothing of its own."""
        try:
            async with asyncio.timeout(FIRST_SHARE_WAIT_S):
                await self.owned.assigned_once.wait()
        except TimeoutError:
            log.warning("bridge has no partition assignment after %.0fs", FIRST_SHARE_WAIT_S)

    @staticmethod
    async def _loop(reader, timeout_ms: int) -> None:
        while True:
            await reader.poll_once(timeout_ms)

    async def stop(self) -> None:
        for reader in (self.owned, self.guest, self.backfill):
            await reader.stop()

    def take(self, records: list[ConsumerRecord], owned: bool) -> None:
        """The hot path: one fetched batch of one partition; records nobody here wants are not decoded."""
        keys = self.interest.keys
        first = records[0]
        every = self.decode_all or (owned and first.topic == GENERATIONS)
        if not self.decode_all:
            self.recent.add(TopicPartition(first.topic, first.partition), records)
        decoded = 0
        for record in records:
            wanted = record.key in keys
            if not (wanted or every or (owned and is_final(record))):
                continue
            try:
                event = decode(record.topic, record.value)
            except DecodeError as exc:
                log.warning("bridge skipped record topic=%s partition=%d offset=%d error=%s", record.topic,
                            record.partition, record.offset, type(exc).__name__)
                continue
            decoded += 1
            self.bridge.on_event(record.topic, event, wanted or self.decode_all)
        self.decoded += decoded
        self.skipped += len(records) - decoded

    async def attend(self, generation_id: str) -> None:
        """One more local party needs this generation; the first one reads back what was skipped."""
        if not self.interest.add(generation_id):
            filling = self._filling.get(generation_id)
            if filling is not None:
                await asyncio.shield(filling)
            return
        filling = self._filling[generation_id] = asyncio.get_running_loop().create_future()
        self._idle_since.pop(self.interest.partition_of(generation_id), None)
        self.owned.pace()
        try:
            until = await self._live_from(generation_id)
            if not self.decode_all:
                self.bridge.backfilled(generation_id, await self._read_back(generation_id, until))
        except Exception as exc:  # noqa: BLE001 - served from what the live readers and the buffer hold
            log.warning("bridge backfill failed generation=%s error=%s", generation_id, type(exc).__name__)
        finally:
            filling.set_result(None)
            del self._filling[generation_id]

    async def _read_back(self, generation_id: str, until: dict[TopicPartition, int]) -> list[tuple[str, Envelope]]:
        """The generation's records before `until` that the projections lack: from the recent records when
        they hold all of them (no I/O), else from Kafka."""
        if not all(self.recent.complete(tp) for tp in until):
            return await self.backfill.read(generation_id, until)
        key = generation_id.encode()
        events = []
        for tp, end in until.items():
            for record in self.recent.of_key(tp, key, end):
                try:
                    events.append((record.topic, decode(record.topic, record.value)))
                except DecodeError:
                    continue  # logged when the live reader skipped it
        return events

    async def _live_from(self, generation_id: str) -> dict[TopicPartition, int]:
        """Where live reading of this generation's partitions takes over (following it as a guest if not ours)."""
        tps = topic_partitions(self.interest.partition_of(generation_id))
        if all(tp in self.owned.next_offsets for tp in tps):
            return {tp: self.owned.next_offsets[tp] for tp in tps}
        return await self.guest.follow({tp: None for tp in tps})

    def leave(self, generation_id: str) -> None:
        if self.interest.remove(generation_id):
            self.bridge.unwatched(generation_id)
            partition = self.interest.partition_of(generation_id)
            if not self.interest.in_partition(partition):
                self._idle_since[partition] = time.monotonic()
                self.owned.pace()

    async def release_idle(self) -> None:
        now = time.monotonic()
        for partition, since in list(self._idle_since.items()):
            if now - since >= GUEST_LINGER_S:
                del self._idle_since[partition]
                if not self.interest.in_partition(partition):
                    for tp in await self.guest.release(partition):
                        self.recent.forget(tp)

    async def _moved_away(self, handed: dict[TopicPartition, int]) -> None:
        """Revoked from this gateway: partitions a local subscriber needs go on as a guest, from the next
        offset the owner had not handled, so the subscriber sees no gap and no repeat."""
        keep = {tp: offset for tp, offset in handed.items() if self.interest.in_partition(tp.partition)}
        for tp in handed.keys() - keep.keys():
            self.recent.forget(tp)
        if keep:
            await self.guest.follow(keep)

    async def _moved_here(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Assigned to this gateway: where its guest reader stood on these partitions (it stops following them)."""
        stood: dict[TopicPartition, int] = {}
        for partition in sorted({tp.partition for tp in tps}):
            if partition in self.guest.partitions:
                stood.update(await self.guest.release(partition))
        return stood

    def share(self) -> StreamShare | None:
        """The partitions this gateway reads as their owner, for the controller to mint ids into (None: it
        reads every partition, or none yet)."""
        owned = self.owned.held
        if self.decode_all or not owned:
            return None
        return StreamShare(partitions=self.interest.partitions, owned=tuple(sorted(owned)))

    def as_json(self) -> dict:
        return {"ownedPartitions": self.owned.partitions, "guestPartitions": self.guest.partitions,
                "watched": len(self.interest.counts), "recordsDecoded": self.decoded, "recordsSkipped": self.skipped,
                "pacing": self.owned.pacing.mode, "guestPacing": self.guest.pacing.mode}
