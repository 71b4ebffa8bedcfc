"""The projector: Kafka -> Postgres with the consumed offsets stored beside the rows.

    getmany ──► decode (bad record ─► llm.dlq) ──► [ BEGIN
                                                     projection_offsets CAS expected -> next
                                                     projection.apply(rows)
                                                     refused_events (events the database refused)
                                                   COMMIT ] ──► refused events ─► llm.dlq

A consumer that lost its partition in a rebalance still expects the old
offset; its compare-and-set matches no row, the transaction rolls back, and
it re-seeks to whatever the new owner stored. Kafka's own committed offsets
are never used: Postgres is the only place a position is remembered.

The compare-and-set checks the offset a batch replaces, not where the batch
begins, so records before the stored offset are dropped before applying: a
consumer that stands before it (an assignment whose seek did not run: aiokafka
left it at the earliest offset) would otherwise apply them again, and a second
application is not harmless (an Interrupted applied again after its attempt's
delayed AttemptStarted closes an attempt that one application leaves open).
Offsets for an assignment are read on a connection of their own: the rebalance
listener runs in aiokafka's coordinator task, while a batch may hold the
projector's connection in its transaction.

Two modes: `run()` joins a consumer group and seeks to the stored offsets on
every assignment; `catch_up()` assigns partitions itself and stops at given
offsets (audit replay, benchmarks, tests).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord

from plumbing.kafka.clients import LONG_POLL_MS, PATIENT_MEMBER, Kafka, make_consumer, pace_fetches, partitions_of
from plumbing.telemetry.metrics import ProjectorMetrics
from plumbing.telemetry.server import Readiness
from projections.base import Projection
from projections.offsets import StaleOffset, advance, load_offsets
from projections.refused import apply_refusing, store_refused
from schemas.codec import DecodeError, decode
from schemas.envelope import Envelope

log = logging.getLogger(__name__)

# Projections are read models: a status or resume-buffer read may trail the log by this much, and in
# exchange every commit carries a batch. (Live streams are served from the gateway's own view.) A poll that
# brought nothing turns the consumer to long polls until records come: an idle projector asked the broker
# four times a second for nothing.
FETCH_GATHER_BYTES = 16 * 1024
FETCH_GATHER_MS = 250
GATHER = (FETCH_GATHER_BYTES, FETCH_GATHER_MS)

Divert = Callable[[ConsumerRecord], Awaitable[Envelope | None]]


@dataclass
class Batch:
    """One partition's decoded records of a poll: the stored offset they were read against, and the one the
    projection moves to. The commit expects the former: the rebalance listener may load a newer stored offset
    (another member's progress) while the batch is decoded or committed, and a batch committed against that
    one would apply its records a second time."""

    projection: Projection
    tp: TopicPartition
    expected: int | None
    next_offset: int
    events: list[Envelope] = field(default_factory=list)
    offsets: dict[int, int] = field(default_factory=dict)  # id(event) -> its record's offset
    keys: dict[int, bytes | None] = field(default_factory=dict)  # id(event) -> its record's key


@dataclass
class ProjectorStats:
    applied: dict[str, int] = field(default_factory=dict)
    dead_lettered: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    stale_refusals: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # time in each projection's statements
    lag: dict[str, int] = field(default_factory=dict)


def connect(database_url: str, schema: str | None = None) -> psycopg.Connection:
    options = f"-c search_path={schema}" if schema else None
    return psycopg.connect(database_url, options=options) if options else psycopg.connect(database_url)


async def decode_quietly(record: ConsumerRecord) -> Envelope | None:
    """For replays: an undecodable record was dead-lettered when first seen; skip it silently."""
    try:
        return decode(record.topic, record.value)
    except DecodeError:
        return None


class Projector:
    def __init__(self, kafka: Kafka, database_url: str, projections: Sequence[Projection], *,
                 divert: Divert = decode_quietly, schema: str | None = None,
                 group_id: str = "ledgerlm-projector", max_records: int = 5000,
                 crash_after_batches: int | None = None,
                 on_commit: Callable[[str, list[Envelope]], None] | None = None,
                 metrics_path: Path | None = None,
                 reject: Callable[[TopicPartition, int, Envelope, str, bytes | None], Awaitable[None]] | None = None,
                 ready_lag: int = 1000) -> None:
        self.kafka = kafka
        self.database_url = database_url
        self.schema = schema
        self.by_topic = {p.topic: p for p in projections}
        self.divert = divert
        self.group_id = group_id
        self.max_records = max_records
        self.conn = connect(database_url, schema)
        self.stored: dict[TopicPartition, int | None] = {}
        self.stats = ProjectorStats()
        self.crash_after_batches = crash_after_batches
        self.on_commit = on_commit  # observes committed batches (benchmarks measure lag with it)
        self.assignment: set[TopicPartition] = set()  # group mode: partitions this member owns now
        self.metrics_path = metrics_path
        self.reject = reject  # where events the database refused are reported (the CLI: llm.dlq)
        self._batches = 0
        self.metrics = ProjectorMetrics(lambda: self.stats.applied)
        self.ready_lag = ready_lag
        self.lag_measured = False

    def readiness(self) -> Readiness:
        """Ready: partitions assigned, lag measured since, and no projection more than `ready_lag` records behind."""
        return Readiness({"assigned": bool(self.assignment), "lag_measured": self.lag_measured,
                          "caught_up": max(self.stats.lag.values(), default=0) <= self.ready_lag})

    def close(self) -> None:
        self.conn.close()

    # -- positions ---------------------------------------------------------
    def _load_stored(self, partitions: Sequence[TopicPartition]) -> None:
        """The committed offsets of `partitions`, on a connection of its own (never inside a batch's transaction)."""
        by_topic: dict[str, dict[int, int]] = {}
        with connect(self.database_url, self.schema) as conn:
            for tp in partitions:
                if tp.topic not in by_topic:
                    by_topic[tp.topic] = load_offsets(conn, self.by_topic[tp.topic].name, tp.topic)
                self.stored[tp] = by_topic[tp.topic].get(tp.partition)

    async def _seek_stored(self, consumer: AIOKafkaConsumer, partitions: Sequence[TopicPartition]) -> None:
        await asyncio.to_thread(self._load_stored, partitions)
        for tp in partitions:
            if self.stored[tp] is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, self.stored[tp])

    # -- applying ----------------------------------------------------------
    async def _apply_polled(self, consumer: AIOKafkaConsumer,
                            batches: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Every partition's records of one poll in one Postgres transaction, offsets included."""
        items: list[Batch] = []
        for tp, polled in batches.items():
            stored = self.stored.get(tp)
            records = self._unapplied(consumer, tp, polled, stored)
            if not records:
                continue
            projection = self.by_topic[tp.topic]
            item = Batch(projection, tp, stored, records[-1].offset + 1)
            for record in records:
                event = await self.divert(record)
                if event is None:
                    self.stats.dead_lettered[projection.name] = self.stats.dead_lettered.get(projection.name, 0) + 1
                else:
                    item.events.append(event)
                    item.offsets[id(event)] = record.offset
                    item.keys[id(event)] = record.key
            items.append(item)
        if not items:
            return
        try:
            refused_by_item = await asyncio.to_thread(self._commit_batches, items)
        except StaleOffset:
            self.stats.stale_refusals += 1
            log.warning("stale offset refused partitions=%s; re-seeking",
                        ",".join(f"{i.tp.topic}:{i.tp.partition}" for i in items))
            await self._seek_stored(consumer, [i.tp for i in items])
            return
        for item, refused in zip(items, refused_by_item):
            name = item.projection.name
            self.stats.applied[name] = self.stats.applied.get(name, 0) + len(item.events) - len(refused)
            for event, reason in refused:
                self.stats.refused[name] = self.stats.refused.get(name, 0) + 1
                await self._dead_letter(item, event, reason)
            if self.on_commit is not None:
                self.on_commit(name, item.events)

    async def _pass_skipped(self, consumer: AIOKafkaConsumer,
                            targets: dict[TopicPartition, int] | None = None) -> None:
        """After a poll with no records: move each stored offset on to where the consumer reads next, past the
        transaction markers and aborted batches it skipped. Those take offsets no record comes back for, so a
        partition whose last write was a transaction's would otherwise stand one behind its end for good: a lag
        of 1 that never clears, and an exporter (which never passes this projection) that never catches up.

        With `targets` (a catch-up), only those partitions and never past a target: records at or after it
        were read and dropped, not applied, and a replay must stand where live stands, not one short of it."""
        items = []
        for tp in list(consumer.assignment() if targets is None else targets):
            stored = self.stored.get(tp)
            to = await consumer.position(tp)
            if targets is not None:
                to = min(to, targets[tp])
            if stored is not None and to > stored:
                items.append(Batch(self.by_topic[tp.topic], tp, stored, to))
        if not items:
            return
        try:
            await asyncio.to_thread(self._commit_batches, items)
        except StaleOffset:
            self.stats.stale_refusals += 1
            await self._seek_stored(consumer, [i.tp for i in items])

    def _unapplied(self, consumer: AIOKafkaConsumer, tp: TopicPartition,
                   records: list[ConsumerRecord], stored: int | None) -> list[ConsumerRecord]:
        """The records at or after the stored offset; when none is, the consumer is sent there."""
        if stored is None or records[0].offset >= stored:
            return records
        fresh = [r for r in records if r.offset >= stored]
        log.warning("records before the stored offset dropped topic=%s partition=%d from=%d stored=%d count=%d",
                    tp.topic, tp.partition, records[0].offset, stored, len(records) - len(fresh))
        if not fresh:
            consumer.seek(tp, stored)
        return fresh

    async def _dead_letter(self, item: Batch, event: Envelope, reason: str) -> None:
        """Report a refused event (the CLI: to llm.dlq). It is already in `refused_events`, committed with the
        offset that skips it, so a report that fails loses nothing."""
        if self.reject is None:
            return
        try:
            await self.reject(item.tp, item.offsets[id(event)], event, reason, item.keys.get(id(event)))
        except Exception as exc:
            log.error("refused event not dead-lettered, kept in refused_events projection=%s topic=%s partition=%d "
                      "offset=%d error=%s", item.projection.name, item.tp.topic, item.tp.partition,
                      item.offsets[id(event)], type(exc).__name__)

    def _commit_batches(self, items: list["Batch"]) -> list[list[tuple[Envelope, str]]]:
        """Apply and advance every batch in one transaction; per batch, the events the database refused.

        One transaction per poll rather than per partition: the fixed cost of a commit (and of each
        projection's statements) is paid once for every partition that had records."""
        for attempt in range(5):
            try:
                with self.conn.transaction():
                    # the offsets first: a member that lost a partition in a rebalance waits here on the
                    # new owner's row lock and gets StaleOffset, before it writes anything twice
                    for item in sorted(items, key=lambda i: (i.projection.name, i.tp.topic, i.tp.partition)):
                        advance(self.conn, item.projection.name, item.tp.topic, item.tp.partition,
                                item.expected, item.next_offset)
                    refused = self._apply_grouped(items)
                    for item, item_refused in zip(items, refused):
                        store_refused(self.conn, item.projection.name, item.tp,
                                      [(item.offsets[id(e)], e, reason) for e, reason in item_refused])
                    if any(item.events for item in items):
                        self._maybe_crash()
                self.conn.commit()
                for item in items:
                    self.stored[item.tp] = item.next_offset
                return refused
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                self.conn.rollback()
                log.warning("retrying batch after lock conflict attempt=%d partitions=%d", attempt, len(items))
                time.sleep(0.05 * (attempt + 1))
            except Exception:
                self.conn.rollback()
                raise
        raise RuntimeError("projection batch kept conflicting; giving up")

    def _apply_grouped(self, items: list[Batch]) -> list[list[tuple[Envelope, str]]]:
        """One `apply` per projection over all its partitions' events (records of different partitions
        are about different generations, so their order relative to each other does not matter)."""
        refused_ids: dict[int, str] = {}
        by_projection: dict[str, list[Batch]] = {}
        for item in items:
            by_projection.setdefault(item.projection.name, []).append(item)
        for group in by_projection.values():
            events = [event for item in group for event in item.events]
            if not events:  # offsets moved past markers only
                continue
            projection = group[0].projection
            began = time.perf_counter()
            for event, reason in apply_refusing(self.conn, projection, events):
                refused_ids[id(event)] = reason
            self.stats.seconds[projection.name] = self.stats.seconds.get(projection.name, 0.0) + (
                time.perf_counter() - began)
        return [[(e, refused_ids[id(e)]) for e in item.events if id(e) in refused_ids] for item in items]

    def _maybe_crash(self) -> None:
        """Fault injection: die after the rows are written and before the commit."""
        self._batches += 1
        if self.crash_after_batches is not None and self._batches >= self.crash_after_batches:
            log.error("fault injection: exiting before commit batch=%d", self._batches)
            os._exit(86)

    # -- modes -------------------------------------------------------------
    async def run(self, stop: asyncio.Event, lag_every_s: float = 10.0) -> ProjectorStats:
        """Consume as a group member until `stop` is set."""
        # The broker holds a fetch until a few KB are there (or FETCH_GATHER_MS passed): under load a poll
        # brings a batch of many events, applied with one transaction, instead of a trickle of tiny ones.
        consumer = make_consumer(self.kafka, group_id=self.group_id, client_id="ledgerlm-projector",
                                 fetch_min_bytes=GATHER[0], fetch_max_wait_ms=GATHER[1], **PATIENT_MEMBER)
        projector = self

        class SeekToStored(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                projector.assignment -= set(revoked)

            async def on_partitions_assigned(self, assigned):
                await projector._seek_stored(consumer, list(assigned))
                projector.assignment |= set(assigned)

        consumer.subscribe(list(self.by_topic), listener=SeekToStored())
        await consumer.start()
        last_lag, gathering = 0.0, True
        try:
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=1000, max_records=self.max_records)
                if bool(batches) != gathering:  # quiet: a long poll the first event answers; then gather again
                    gathering = bool(batches)
                    pace_fetches(consumer, *(GATHER if gathering else (1, LONG_POLL_MS)))
                if batches:
                    await self._apply_polled(consumer, batches)
                else:
                    await self._pass_skipped(consumer)
                if time.monotonic() - last_lag > lag_every_s and await self._report_lag(consumer):
                    last_lag = time.monotonic()
        finally:
            await consumer.stop()
        return self.stats

    async def _report_lag(self, consumer: AIOKafkaConsumer) -> bool:
        """Measure, log and expose each projection's lag; False while nothing is assigned yet."""
        assigned = list(consumer.assignment())
        if not assigned:
            return False
        ends = await consumer.end_offsets(assigned)
        lag: dict[str, int] = {}
        for tp in assigned:
            name = self.by_topic[tp.topic].name
            lag[name] = lag.get(name, 0) + max(0, ends[tp] - (self.stored.get(tp) or 0))
        self.stats.lag = lag
        self.metrics.observe_lag(lag)
        self.lag_measured = True
        for name, behind in sorted(lag.items()):
            log.info("projection lag projection=%s records=%d", name, behind)
        if self.metrics_path is not None:
            write_lag_metric(self.metrics_path, lag)
        return True

    async def catch_up(self, targets: dict[TopicPartition, int] | None = None,
                       on_progress: Callable[[dict[TopicPartition, int]], None] | None = None) -> ProjectorStats:
        """Apply every assigned partition from its stored offset up to `targets` (default: the end now).

        `on_progress` is told each partition's position once at the start and after every poll."""
        consumer = make_consumer(self.kafka, client_id="ledgerlm-projector-catch-up")
        await consumer.start()
        try:
            partitions = targets and list(targets) or await self._all_partitions(consumer)
            consumer.assign(partitions)
            await self._seek_stored(consumer, partitions)
            targets = targets or await consumer.end_offsets(partitions)
            positions = {tp: await consumer.position(tp) for tp in partitions}
            pending = {tp for tp in partitions if positions[tp] < targets[tp]}
            if on_progress is not None:
                on_progress(positions)
            while pending:
                batches = await consumer.getmany(*pending, timeout_ms=500, max_records=self.max_records)
                batches = {tp: kept for tp, records in batches.items()
                           if (kept := [r for r in records if r.offset < targets[tp]])}
                if batches:
                    await self._apply_polled(consumer, batches)
                else:
                    await self._pass_skipped(consumer, targets)
                # Positions, not offsets: transaction markers leave gaps a record never fills.
                positions.update({tp: await consumer.position(tp) for tp in pending})
                pending = {tp for tp in pending if positions[tp] < targets[tp]}
                if on_progress is not None:
                    on_progress(positions)
            await self._pass_skipped(consumer, targets)  # markers just before a target: stand at it, as live does
        finally:
            await consumer.stop()
        self.stats.lag = {}
        return self.stats

    async def _all_partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        return [tp for topic in self.by_topic for tp in await partitions_of(consumer, topic)]


def write_lag_metric(path: Path, lag: dict[str, int]) -> None:
    """Prometheus text format, replaced atomically (a node exporter's textfile collector reads it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# HELP ledgerlm_projection_lag_records Records in the log not yet applied by the projection.",
             "# TYPE ledgerlm_projection_lag_records gauge"]
    lines += [f'ledgerlm_projection_lag_records{{projection="{name}"}} {behind}'
              for name, behind in sorted(lag.items())]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
