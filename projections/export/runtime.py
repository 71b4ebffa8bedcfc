"""The exporter: llm.generations -> one sink, each seal once, the sink's answers stored with the offsets.

    getmany ─► records the lifecycle projection has committed (the rest: seek back, wait for it)
            ─► terminal events ─► their seals (billing_ledger) the sink's ledger has no row for
            ─► sink.deliver (429/5xx: again, same ids)
            ─► [ BEGIN export_ledger + export_offsets CAS COMMIT ] ─► refused seals ─► llm.dlq

The log decides what is exported and in which order, and where an exporter stands (its offsets); the seal
itself is read from the projection that made it, so no second derivation of a bill can disagree with the
invoice ([decision 0015](../../docs/decisions/0015-export-from-the-log-through-the-seal.md)). Kafka's own
committed offsets are never used: as for the projector, Postgres is the only place a position is kept.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord

from plumbing.kafka.clients import PATIENT_MEMBER, Kafka, make_consumer, make_producer, publish
from plumbing.telemetry.metrics import ExporterMetrics
from plumbing.telemetry.server import Readiness
from projections.export import ledger
from projections.export.ledger import Outcome
from projections.export.records import Export, read_billing_ids, read_seals
from projections.export.sinks.base import Sink, Stopped
from projections.offsets import StaleOffset
from schemas.codec import encode
from schemas.dead_letter import DeadLetter
from schemas.lifecycle import TERMINAL_TYPES
from schemas.topics import DLQ, GENERATIONS

log = logging.getLogger(__name__)

TERMINAL_HEADERS = frozenset(name.encode() for name in TERMINAL_TYPES)
# While the projector trails the exporter, the held-back records are read again after this: the projector
# commits a poll at most every 250 ms (projections/runtime.py), so asking sooner finds nothing new.
PROJECTOR_WAIT_S = 0.25
EXPORT_POLL_MS = 500


@dataclass
class ExporterStats:
    exported: int = 0
    dead_lettered: int = 0
    stale_refusals: int = 0
    lag: int | None = None


@dataclass
class Taken:
    """One partition's records of a poll the exporter handles now, the stored offset they were taken against
    (what the commit expects: the rebalance listener may load another member's newer one meanwhile) and
    where it stands after them."""

    tp: TopicPartition
    expected: int | None
    next_offset: int
    terminal: dict[str, ConsumerRecord] = field(default_factory=dict)  # generation id -> its first terminal


def take(stored: dict[TopicPartition, int | None], batches: dict[TopicPartition, list[ConsumerRecord]],
         positions: dict[TopicPartition, int], projected: dict[int, int]
         ) -> tuple[list[Taken], dict[TopicPartition, int], bool]:
    """One poll's records after the stored offset and before the projector's; where the consumer must read
    again from on each partition it got records held back for the projector or only records before the stored
    offset on; True when some were held back.

    A partition moves on to where the consumer has read up to (`positions`), not only past its last record:
    transaction markers and aborted batches take offsets that no record comes back for. Kept at the last
    record, the exporter would stand before them however far the projector had gone, and a test that waits
    for it to reach the projector's offsets would wait forever. Nothing at or past the projector's offset is
    passed over."""
    taken: list[Taken] = []
    seeks: dict[TopicPartition, int] = {}
    held = False
    for tp in set(batches) | set(positions):
        records = batches.get(tp, [])
        at = stored.get(tp)
        fresh = [r for r in records if at is None or r.offset >= at]
        through = projected.get(tp.partition, 0)
        ready = [r for r in fresh if r.offset < through]
        if records and not fresh:
            seeks[tp] = at
            continue
        if len(ready) < len(fresh):
            held = True
            seeks[tp] = fresh[len(ready)].offset
            read_to = through  # nothing readable lies between the last ready record and the first held one
        else:
            read_to = min(positions.get(tp, 0), through)
        next_offset = max(ready[-1].offset + 1 if ready else 0, read_to)
        if next_offset <= (at or 0):
            continue
        item = Taken(tp, at, next_offset)
        for record in ready:
            if dict(record.headers or ()).get("type") in TERMINAL_HEADERS and record.key is not None:
                item.terminal.setdefault(record.key.decode(), record)
        taken.append(item)
    return taken, seeks, held


class Exporter:
    def __init__(self, kafka: Kafka, database_url: str, sink: Sink, *, group_id: str, source: str,
                 max_records: int = 500, metrics: ExporterMetrics | None = None) -> None:
        self.kafka = kafka
        self.database_url = database_url
        self.sink = sink
        self.group_id = group_id
        self.source = source
        self.max_records = max_records
        self.conn = psycopg.connect(database_url, autocommit=True)
        self.stored: dict[TopicPartition, int | None] = {}
        self.assignment: set[TopicPartition] = set()
        self.stats = ExporterStats()
        self.unexported_floor = ledger.UnexportedFloor()
        self.metrics = metrics or ExporterMetrics(sink.name)
        self.producer = make_producer(kafka, client_id="ledgerlm-export-dlq")

    def readiness(self) -> Readiness:
        return Readiness({"assigned": bool(self.assignment), "lag_measured": self.stats.lag is not None})

    # -- positions ---------------------------------------------------------
    def _load_stored(self, partitions: Sequence[TopicPartition]) -> None:
        with psycopg.connect(self.database_url) as conn:  # not the batch's connection (the listener's task)
            stored = ledger.positions(conn, self.sink.name)
        for tp in partitions:
            self.stored[tp] = stored.get(tp.partition)

    async def _seek_stored(self, consumer: AIOKafkaConsumer, partitions: Sequence[TopicPartition]) -> None:
        await asyncio.to_thread(self._load_stored, partitions)
        for tp in partitions:
            if self.stored[tp] is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, self.stored[tp])

    # -- one poll ------------------------------------------------------------
    def _take(self, consumer: AIOKafkaConsumer, batches: dict[TopicPartition, list[ConsumerRecord]],
              positions: dict[TopicPartition, int], projected: dict[int, int]) -> tuple[list[Taken], bool]:
        """`take` this poll; the consumer is sent back to what it holds back (or to the stored offset)."""
        taken, seeks, held = take(self.stored, batches, positions, projected)
        for tp, offset in seeks.items():
            consumer.seek(tp, offset)
        return taken, held

    async def _positions(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, int]:
        """Where the consumer reads next on each assigned partition it has moved past the stored offset on (a
        poll's records and what it skipped: markers, aborted batches)."""
        moved = {}
        for tp in consumer.assignment():
            position = await consumer.position(tp)
            if position > (self.stored.get(tp) or 0):
                moved[tp] = position
        return moved

    async def _export_polled(self, consumer: AIOKafkaConsumer, stop: asyncio.Event,
                             batches: dict[TopicPartition, list[ConsumerRecord]]) -> bool:
        """Export one poll's sealed attempts; True when records were held back for the projector."""
        positions = await self._positions(consumer)
        projected = await asyncio.to_thread(ledger.projected_through, self.conn)
        taken, held = self._take(consumer, batches, positions, projected)
        if not taken:
            return held
        exports, records = await asyncio.to_thread(self._unexported, taken)
        outcomes = await self.sink.deliver(exports, stop) if exports else []
        try:
            await asyncio.to_thread(self._commit, taken, outcomes)
        except StaleOffset:
            self.stats.stale_refusals += 1
            log.warning("stale export offset refused sink=%s partitions=%s; re-seeking", self.sink.name,
                        ",".join(str(t.tp.partition) for t in taken))
            await self._seek_stored(consumer, [t.tp for t in taken])
            return held
        await self._account(outcomes, records)
        return held

    def _unexported(self, taken: list[Taken]) -> tuple[list[Export], dict[str, ConsumerRecord]]:
        """The seals of this poll's terminal events that the sink's ledger has no answer for."""
        records = {gid: record for item in taken for gid, record in item.terminal.items()}
        seals = read_seals(self.conn, records)
        done = ledger.recorded(self.conn, self.sink.name, seals)
        fresh = [seals[gid] for gid in sorted(seals) if gid not in done]
        billing = read_billing_ids(self.conn, {s.tenant_id for s in fresh})
        return [Export(s, billing[s.tenant_id]) for s in fresh], records

    def _commit(self, taken: list[Taken], outcomes: list[Outcome]) -> None:
        with self.conn.transaction():
            ledger.record(self.conn, self.sink.name, outcomes)
            for item in taken:
                ledger.advance_position(self.conn, self.sink.name, item.tp.partition, item.expected,
                                        item.next_offset)
        for item in taken:
            self.stored[item.tp] = item.next_offset

    async def _account(self, outcomes: list[Outcome], records: dict[str, ConsumerRecord]) -> None:
        """Count what the sink answered and dead-letter what it refused (already in the ledger with its
        reason, so a dead letter that fails to publish loses nothing)."""
        for outcome in outcomes:
            if outcome.reason is None:
                self.stats.exported += 1
                self.metrics.exported.inc()
                continue
            self.stats.dead_lettered += 1
            self.metrics.dead_lettered.inc()
            record = records[outcome.seal.generation_id]
            log.error("sink refused a seal, dead-lettered sink=%s generation=%s epoch=%d", self.sink.name,
                      outcome.seal.generation_id, outcome.seal.epoch)
            letter = DeadLetter(source_topic=GENERATIONS, partition=record.partition, offset=record.offset,
                                key_b64=base64.b64encode(record.key).decode(), error_class="SinkRefused",
                                reason=f"{self.sink.name}: {outcome.reason}",
                                payload_b64=base64.b64encode(encode(outcome.seal.cloudevent(self.source))).decode())
            try:
                await publish(self.producer, DLQ, letter)
            except Exception as exc:
                log.error("dead letter not published, kept in export_ledger sink=%s generation=%s error=%s",
                          self.sink.name, outcome.seal.generation_id, type(exc).__name__)

    # -- the role ------------------------------------------------------------
    async def run(self, stop: asyncio.Event, lag_every_s: float = 10.0) -> ExporterStats:
        """Export as a member of the sink's consumer group until `stop` is set."""
        # It seeks back over what the projector has not committed yet, and a seek waits for the fetch in flight:
        # its long polls stay short (the shared 2 s made every hold-back cost up to 2 s).
        consumer = make_consumer(self.kafka, group_id=self.group_id, client_id=f"ledgerlm-export-{self.sink.name}",
                                 fetch_max_wait_ms=EXPORT_POLL_MS, **PATIENT_MEMBER)
        exporter = self

        class SeekToStored(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                exporter.assignment -= set(revoked)

            async def on_partitions_assigned(self, assigned):
                await exporter._seek_stored(consumer, list(assigned))
                exporter.assignment |= set(assigned)

        await self.producer.start()
        await self.sink.start()
        consumer.subscribe([GENERATIONS], listener=SeekToStored())
        await consumer.start()
        last_lag = 0.0
        try:
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=1000, max_records=self.max_records)
                # A poll with no records may still have moved past markers (see `take`): those offsets count too.
                held = (bool(batches) or bool(await self._positions(consumer))) and await self._export_polled(
                    consumer, stop, batches)
                if time.monotonic() - last_lag > lag_every_s and await self._report_lag(consumer):
                    last_lag = time.monotonic()
                if held:
                    await asyncio.sleep(PROJECTOR_WAIT_S)
        except Stopped:
            log.info("stopped while a sink was unavailable sink=%s; unrecorded seals go again on restart",
                     self.sink.name)
        finally:
            await consumer.stop()
            await self.sink.stop()
            await self.producer.stop()
            self.conn.close()
        return self.stats

    async def _report_lag(self, consumer: AIOKafkaConsumer) -> bool:
        assigned = list(consumer.assignment())
        if not assigned:
            return False
        ends = await consumer.end_offsets(assigned)
        lag = sum(max(0, ends[tp] - (self.stored.get(tp) or 0)) for tp in assigned)
        oldest, newest = await asyncio.to_thread(ledger.oldest_unexported, self.conn, self.sink.name,
                                                 self.unexported_floor.since())
        self.unexported_floor.observe(oldest, newest)
        age = (datetime.now(UTC) - oldest).total_seconds() if oldest is not None else 0.0
        self.stats.lag = lag
        self.metrics.lag.set(lag)
        self.metrics.oldest_unexported.set(max(0.0, age))
        log.info("export lag sink=%s records=%d oldest_unexported_s=%.0f", self.sink.name, lag, age)
        return True
