"""Read back what the live readers skipped of one generation, when it gains its first local subscriber.

    projections' offset ──── records skipped (nobody here watched) ────▶ live reader's next offset ──▶ live
    └─ resume buffer in Postgres before ─┘└─ this read, filtered by key ─┘└─ decoded live from now on ─┘

Only the generation's partition of `llm.generations` and `llm.tokens` is read,
from where the projections stand (`replay.py`) to where live reading took over,
and only records keyed by the generation are decoded. With the projector keeping
up this is a few records; it is the same bounded read a starting gateway does,
for one partition, shared by every subscriber that arrives meanwhile.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from plumbing.kafka.clients import Kafka, make_consumer
from producers.gateway.streams.readers import Positions
from schemas.codec import DecodeError, decode
from schemas.envelope import Envelope

log = logging.getLogger(__name__)

BACKFILL_TIMEOUT_S = 10.0


@dataclass
class Request:
    key: bytes
    until: dict[TopicPartition, int]
    done: asyncio.Future
    events: list[tuple[str, Envelope]] = field(default_factory=list)


class Backfill:
    """Requests that arrive together (a burst of new subscribers) share one read of each partition."""

    def __init__(self, kafka: Kafka, positions: Positions | None) -> None:
        self.kafka = kafka
        self.positions = positions  # None: the bridge starts at the end, and so skipped nothing it must read back
        self.consumer = None
        self.pending: list[Request] = []
        self._worker: asyncio.Task | None = None

    async def start(self) -> None:
        if self.positions is not None:
            self.consumer = make_consumer(self.kafka, client_id="gateway-bridge-backfill")
            await self.consumer.start()

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        if self.consumer is not None:
            await self.consumer.stop()

    async def read(self, generation_id: str, until: dict[TopicPartition, int]) -> list[tuple[str, Envelope]]:
        """The records of `generation_id` before `until` (per partition) that the projections lack, decoded."""
        if self.consumer is None:
            return []
        request = Request(generation_id.encode(), until, asyncio.get_running_loop().create_future())
        self.pending.append(request)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="bridge-backfill")
        return await request.done

    async def _drain(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            started = time.monotonic()
            try:
                read = await self._read_for(batch)
            except Exception as exc:  # noqa: BLE001 - each waiting subscriber gets the error
                for request in batch:
                    if not request.done.done():
                        request.done.set_exception(exc)
                continue
            for request in batch:
                if not request.done.done():
                    request.done.set_result(request.events)
            log.info("bridge backfill generations=%d records_read=%d ms=%.1f", len(batch), read,
                     (time.monotonic() - started) * 1000)

    async def _read_for(self, batch: list[Request]) -> int:
        ends: dict[TopicPartition, int] = {}
        for request in batch:
            for tp, offset in request.until.items():
                ends[tp] = max(ends.get(tp, 0), offset)
        tps = sorted(ends)
        self.consumer.assign(tps)
        starts = await self.positions(self.consumer, tps)
        for tp in tps:
            self.consumer.seek(tp, min(starts[tp], ends[tp]))
        by_key: dict[bytes, list[Request]] = {}
        for request in batch:
            by_key.setdefault(request.key, []).append(request)
        return await self._read_until(by_key, ends, time.monotonic() + BACKFILL_TIMEOUT_S)

    async def _read_until(self, by_key: dict[bytes, list[Request]], ends: dict[TopicPartition, int],
                          deadline: float) -> int:
        read = 0
        pending = {tp for tp in ends if await self.consumer.position(tp) < ends[tp]}
        while pending:
            if time.monotonic() > deadline:
                log.warning("bridge backfill incomplete partitions=%s", sorted(tp.partition for tp in pending))
                break
            for tp, records in (await self.consumer.getmany(*pending, timeout_ms=200)).items():
                read += len(records)
                for record in records:
                    requests = by_key.get(record.key)
                    if requests is not None:
                        self._deliver(tp, record, requests)
            pending = {tp for tp in pending if await self.consumer.position(tp) < ends[tp]}
        return read

    @staticmethod
    def _deliver(tp: TopicPartition, record, requests: list[Request]) -> None:
        wanting = [r for r in requests if record.offset < r.until.get(tp, 0)]
        if not wanting:
            return
        try:
            event = decode(record.topic, record.value)
        except DecodeError as exc:
            log.warning("bridge backfill skipped record topic=%s offset=%d error=%s", record.topic, record.offset,
                        type(exc).__name__)
            return
        for request in wanting:
            request.events.append((record.topic, event))
