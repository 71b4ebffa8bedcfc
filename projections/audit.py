"""`ledgerlm audit replay [--since-checkpoint]`: replay the log into a shadow schema and compare it with live.

    1. REPEATABLE READ snapshot of live, held to the end: its stored offsets and one hash per table.
    2. Replay every projection into the shadow, all of them in one projector as live runs (one
       transaction per poll, COPY), up to exactly the offsets live had stored in that snapshot:
         full                from offset 0 into a new schema;
         --since-checkpoint  from the checkpoint's offsets into the checkpoint (audit_checkpoint.py),
                             so the audit costs what was appended since, not the whole history.
    3. Hash the shadow's tables; only a table whose hash differs from live's is copied out of the
       snapshot and compared row by row (audit_compare.py).
    4. Keep the shadow as the next checkpoint; drop the copies.

Replaying to the *live* offsets rather than the end of the log keeps a live projector that is
mid-batch from showing up as a difference; how far live is behind the end of the log is reported as lag.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TextIO

import psycopg
from aiokafka import TopicPartition

from plumbing.kafka.clients import Kafka, make_consumer, partitions_of
from plumbing.settings import Settings
from migrations import runner
from projections import audit_checkpoint as checkpoint
from projections.audit_compare import PER_PROJECTION, Comparer, TableDiff, TableHash, pin_session
from projections.audit_progress import ReplayProgress
from projections.registry import all_projections
from projections.runtime import Projector, connect
from projections.stream_buffer import StreamBufferProjection

AUDIT_LOCK = "ledgerlm-audit"  # one audit at a time: they share the checkpoint


@dataclass
class AuditReport:
    replayed: dict[str, int]
    lag: dict[str, int]
    diffs: dict[str, TableDiff]
    mode: str = "full"
    seconds: dict[str, float] = field(default_factory=dict)  # per projection: time in its statements
    rows_compared: dict[str, int] = field(default_factory=dict)  # per table: rows on the live side
    tables_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    total_seconds: float = 0.0
    replay_seconds: float = 0.0

    @property
    def differences(self) -> int:
        return sum(d.live_only_count + d.shadow_only_count for d in self.diffs.values())

    def as_dict(self) -> dict[str, object]:
        replayed = sum(self.replayed.values())
        return {"differences": self.differences, "mode": self.mode, "replayed": self.replayed, "lag": self.lag,
                "projections": {name: {"records": self.replayed.get(name, 0),
                                       "seconds": round(self.seconds.get(name, 0.0), 3),
                                       "rows_compared": sum(self.rows_compared.get(t, 0) for t in tables)}
                                for name, tables in self.tables_of.items()},
                "rows_compared": self.rows_compared, "replay_seconds": round(self.replay_seconds, 3),
                "total_seconds": round(self.total_seconds, 3),
                "records_per_s": round(replayed / self.replay_seconds, 1) if self.replay_seconds else None,
                "tables": {name: d.__dict__ for name, d in self.diffs.items()
                           if d.live_only_count or d.shadow_only_count}}


async def audit_replay(kafka: Kafka, database_url: str, settings: Settings, *, since_checkpoint: bool = False,
                       progress: TextIO | None = None) -> AuditReport:
    """Raises `audit_checkpoint.CheckpointUnusable` for --since-checkpoint without a usable checkpoint."""
    began = time.perf_counter()
    projections = all_projections(settings)
    names = [p.name for p in projections]
    # refused_events too: a replay refuses the same events for the same reasons, so it must match as well.
    tables = [t for p in projections for t in p.tables()] + list(PER_PROJECTION)
    buffers = [p for p in projections if isinstance(p, StreamBufferProjection)]
    comparer = Comparer(tables, names, buffers[0].keep_after_end if buffers else None)
    tag = uuid.uuid4().hex[:10]
    shadow = checkpoint.SCHEMA if since_checkpoint else f"audit_{tag}_shadow"
    copies = f"audit_{tag}_live"
    with psycopg.connect(database_url) as snap:
        try:
            if not snap.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (AUDIT_LOCK,)).fetchone()[0]:
                raise checkpoint.CheckpointUnusable("another audit is running")
            snap.commit()
            snap.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            pin_session(snap)
            offsets = live_offsets(snap, names)
            live_hashes = comparer.hashes(snap, "public")
            if since_checkpoint:
                start_from_checkpoint(database_url, comparer, offsets)
            else:
                runner.upgrade(database_url, schema=shadow)
            replay_began = time.perf_counter()
            lag, stats = await asyncio.gather(live_lag(kafka, offsets, projections),
                                              replay(kafka, database_url, shadow, projections, offsets, progress))
            replay_seconds = time.perf_counter() - replay_began
            with connect(database_url) as conn:
                pin_session(conn)
                shadow_hashes = comparer.hashes(conn, shadow)
            differing = [t for t in tables if live_hashes[t] != shadow_hashes[t]]
            comparer.copy(snap, "public", copies, differing)
            snap.commit()
            with connect(database_url) as conn:
                pin_session(conn)
                diffs = {t: comparer.diff(conn, copies, shadow, t) if t in differing else TableDiff() for t in tables}
                checkpoint.store(conn, shadow, shadow_hashes)
        finally:
            snap.rollback()
            snap.autocommit = True
            snap.execute(f'DROP SCHEMA IF EXISTS "{copies}" CASCADE')
            if shadow != checkpoint.SCHEMA:
                snap.execute(f'DROP SCHEMA IF EXISTS "{shadow}" CASCADE')
    return AuditReport(replayed={n: stats.applied.get(n, 0) for n in names}, lag=lag, diffs=diffs,
                       mode="since-checkpoint" if since_checkpoint else "full", seconds=stats.seconds,
                       rows_compared={t: h.rows for t, h in live_hashes.items()},
                       tables_of={p.name: p.tables() for p in projections},
                       total_seconds=time.perf_counter() - began, replay_seconds=replay_seconds)


def live_offsets(conn: psycopg.Connection, projections: list[str]) -> dict[tuple[str, TopicPartition], int]:
    """Each audited projection's stored offsets, read in the snapshot (another consumer's are not ours)."""
    rows = conn.execute("SELECT projection, topic, partition, next_offset FROM public.projection_offsets "
                        "WHERE projection = ANY(%s)", (projections,)).fetchall()
    return {(name, TopicPartition(topic, partition)): offset for name, topic, partition, offset in rows}


def start_from_checkpoint(database_url: str, comparer: Comparer,
                          offsets: dict[tuple[str, TopicPartition], int]) -> None:
    """Check the checkpoint is usable: present, unchanged, and not ahead of live anywhere."""
    with connect(database_url) as conn:
        pin_session(conn)
        if not checkpoint.exists(conn):
            raise checkpoint.CheckpointUnusable("no checkpoint yet; run a full `audit replay` first")
        checkpoint.verify(conn, comparer.tables)
        rows = conn.execute(f'SELECT projection, topic, partition, next_offset FROM "{checkpoint.SCHEMA}".'
                            "projection_offsets").fetchall()
    ahead = [f"{name} {topic}[{partition}]" for name, topic, partition, at in rows
             if at > offsets.get((name, TopicPartition(topic, partition)), 0)]
    if ahead:
        raise checkpoint.CheckpointUnusable(f"live is behind the checkpoint at {', '.join(sorted(ahead))} "
                                            "(rebuilt?); run a full `audit replay`")


async def replay(kafka: Kafka, database_url: str, shadow: str, projections: list,
                 offsets: dict[tuple[str, TopicPartition], int], progress: TextIO | None):
    """Every projection in one projector, as live runs them, from the shadow's offsets up to live's."""
    targets = {tp: off for (_, tp), off in offsets.items()}
    projector = Projector(kafka, database_url, projections, schema=shadow, max_records=10000)
    reporter = ReplayProgress(progress, {p.topic: p.name for p in projections}, targets)
    try:
        return await projector.catch_up(targets, on_progress=reporter) if targets else projector.stats
    finally:
        projector.close()


async def live_lag(kafka: Kafka, offsets: dict[tuple[str, TopicPartition], int], projections) -> dict[str, int]:
    consumer = make_consumer(kafka)
    await consumer.start()
    try:
        lag: dict[str, int] = {}
        for projection in projections:
            partitions = await partitions_of(consumer, projection.topic)
            ends = await consumer.end_offsets(partitions)
            lag[projection.name] = sum(max(0, ends[tp] - offsets.get((projection.name, tp), 0)) for tp in partitions)
        return lag
    finally:
        await consumer.stop()
