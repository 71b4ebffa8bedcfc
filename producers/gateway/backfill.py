"""Read back what the live readers skipped of one generation, when it gains its first local subscriber.

    projections' offset ──── records skipped (nobody here watched) ────▶ live reader's next offset ──▶ live
    └─ resume buffer in Postgres before ─┘└─ this read, filtered by key ─┘└─ decoded live from now on ─┘

Only the generation's partition of `llm.generations` and `llm.tokens` is read,
from where the projections stand (`replay.py`) to where live reading took over,
and only records keyed by the generation are decoded. With the projector keeping
up this is a few records; it is the same bounded read a starting gateway does,
for one partition.
"""
from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import TopicPartition

from plumbing.kafka.clients import Kafka, make_consumer
from producers.gateway.bridge_readers import Positions
from schemas.codec import DecodeError, decode
from schemas.envelope import Envelope

log = logging.getLogger(__name__)

BACKFILL_TIMEOUT_S = 10.0


class Backfill:
    def __init__(self, kafka: Kafka, positions: Positions | None) -> None:
        self.kafka = kafka
        self.positions = positions  # None: the bridge starts at the end, and so skipped nothing it must read back
        self.consumer = None
        self.lock = asyncio.Lock()

    async def start(self) -> None:
        if self.positions is not None:
            self.consumer = make_consumer(self.kafka, client_id="gateway-bridge-backfill")
            await self.consumer.start()

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()

    async def read(self, generation_id: str, until: dict[TopicPartition, int]) -> list[tuple[str, Envelope]]:
        """The records of `generation_id` before `until` (per partition) that the projections lack, decoded."""
        if self.consumer is None:
            return []
        async with self.lock:
            started = time.monotonic()
            tps = sorted(until)
            self.consumer.assign(tps)
            starts = await self.positions(self.consumer, tps)
            for tp in tps:
                self.consumer.seek(tp, min(starts[tp], until[tp]))
            events, read = await self._read_until(generation_id.encode(), until, started + BACKFILL_TIMEOUT_S)
            log.info("bridge backfill generation=%s records_read=%d events=%d ms=%.1f", generation_id, read,
                     len(events), (time.monotonic() - started) * 1000)
            return events

    async def _read_until(self, key: bytes, until: dict[TopicPartition, int],
                          deadline: float) -> tuple[list[tuple[str, Envelope]], int]:
        events: list[tuple[str, Envelope]] = []
        read = 0
        pending = {tp for tp in until if await self.consumer.position(tp) < until[tp]}
        while pending:
            if time.monotonic() > deadline:
                log.warning("bridge backfill incomplete partitions=%s", sorted(tp.partition for tp in pending))
                break
            for tp, records in (await self.consumer.getmany(*pending, timeout_ms=200)).items():
                read += len(records)
                for record in records:
                    if record.key == key and record.offset < until[tp]:
                        try:
                            events.append((record.topic, decode(record.topic, record.value)))
                        except DecodeError as exc:
                            log.warning("bridge backfill skipped record topic=%s offset=%d error=%s", record.topic,
                                        record.offset, type(exc).__name__)
            pending = {tp for tp in pending if await self.consumer.position(tp) < until[tp]}
        return events, read
