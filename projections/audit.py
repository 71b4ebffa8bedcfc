"""`ledgerlm audit replay`: rebuild every projection from offset 0 and diff it with the live one.

    1. REPEATABLE READ snapshot of live: copy every projected table and the
       stored offsets into schema audit_<id>_live (one consistent instant).
    2. Migrate schema audit_<id>_shadow and replay each projection from
       offset 0 up to exactly the offsets live had stored in that snapshot.
    3. Finish log-time trimming of resume buffers on both copies (the live
       trimmer works in bounded batches and may not have reached them yet).
    4. EXCEPT ALL both ways per table; any row on one side only is a difference.
    5. Drop both schemas.

Replaying to the *live* offsets rather than the end of the log keeps a live
projector that is mid-batch from showing up as a difference; how far live
is behind the end of the log is reported as lag.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import psycopg
from aiokafka import TopicPartition

from consumers.kafka.clients import Kafka, make_consumer, partitions_of
from ledgerlm.settings import Settings
from migrations import runner
from projections.registry import all_projections
from projections.runtime import Projector, connect
from projections.stream_buffer import StreamBufferProjection

MAX_ROWS_SHOWN = 20
# Tables shared by every projection (a `projection` column): only the audited projections' rows are compared.
PER_PROJECTION = ("projection_offsets", "refused_events")


@dataclass
class TableDiff:
    live_only: list[str] = field(default_factory=list)
    shadow_only: list[str] = field(default_factory=list)
    live_only_count: int = 0
    shadow_only_count: int = 0


@dataclass
class AuditReport:
    replayed: dict[str, int]
    lag: dict[str, int]
    diffs: dict[str, TableDiff]

    @property
    def differences(self) -> int:
        return sum(d.live_only_count + d.shadow_only_count for d in self.diffs.values())

    def as_dict(self) -> dict[str, object]:
        return {"differences": self.differences, "replayed": self.replayed, "lag": self.lag,
                "tables": {name: d.__dict__ for name, d in self.diffs.items()
                           if d.live_only_count or d.shadow_only_count}}


async def audit_replay(kafka: Kafka, database_url: str, settings: Settings) -> AuditReport:
    projections = all_projections(settings)
    # refused_events too: a replay refuses the same events for the same reasons, so it must match as well.
    tables = [t for p in projections for t in p.tables()] + list(PER_PROJECTION)
    tag = uuid.uuid4().hex[:10]
    live, shadow = f"audit_{tag}_live", f"audit_{tag}_shadow"
    try:
        offsets = snapshot_live(database_url, live, tables, [p.name for p in projections])
        runner.upgrade(database_url, schema=shadow)
        lag = await live_lag(kafka, offsets, projections)
        replayed: dict[str, int] = {}
        for projection in projections:
            targets = {tp: off for (name, tp), off in offsets.items() if name == projection.name}
            projector = Projector(kafka, database_url, [projection], schema=shadow)
            try:
                stats = await projector.catch_up(targets) if targets else None
            finally:
                projector.close()
            replayed[projection.name] = stats.applied.get(projection.name, 0) if stats else 0
        buffers = [p for p in projections if isinstance(p, StreamBufferProjection)]
        with psycopg.connect(database_url, autocommit=True) as conn:
            for schema in (live, shadow):
                finish_trimming(database_url, schema, buffers)
            diffs = {table: diff_table(conn, live, shadow, table) for table in tables}
        return AuditReport(replayed=replayed, lag=lag, diffs=diffs)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{live}" CASCADE')
            conn.execute(f'DROP SCHEMA IF EXISTS "{shadow}" CASCADE')


def snapshot_live(database_url: str, copy_schema: str, tables: list[str],
                  projections: list[str]) -> dict[tuple[str, TopicPartition], int]:
    """Copy the live tables at one instant; return each projection's stored offsets at that instant.

    Only the offsets of the projections being audited are copied and compared: another
    consumer that keeps its position in the same table is none of this audit's business.
    """
    with psycopg.connect(database_url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            conn.execute(f'CREATE SCHEMA "{copy_schema}"')
            for table in tables:
                where = " WHERE projection = ANY(%s)" if table in PER_PROJECTION else ""
                conn.execute(f'CREATE TABLE "{copy_schema}".{table} AS SELECT * FROM public.{table}{where}',
                             (projections,) if where else None)
            rows = conn.execute("SELECT projection, topic, partition, next_offset FROM public.projection_offsets "
                                "WHERE projection = ANY(%s)", (projections,)).fetchall()
    return {(name, TopicPartition(topic, partition)): offset for name, topic, partition, offset in rows}


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


def finish_trimming(database_url: str, schema: str, buffers: list[StreamBufferProjection]) -> None:
    with connect(database_url, schema) as conn:
        for buffer in buffers:
            while buffer.trim_ended(conn, 1000):
                pass
        conn.commit()


def diff_table(conn: psycopg.Connection, live: str, shadow: str, table: str) -> TableDiff:
    diff = TableDiff()
    for side, (a, b) in (("live_only", (live, shadow)), ("shadow_only", (shadow, live))):
        query = f'SELECT * FROM "{a}".{table} EXCEPT ALL SELECT * FROM "{b}".{table}'
        count = conn.execute(f"SELECT count(*) FROM ({query}) d").fetchone()[0]
        rows = conn.execute(f"SELECT d::text FROM ({query}) d ORDER BY 1 LIMIT {MAX_ROWS_SHOWN}").fetchall()
        setattr(diff, f"{side}_count", count)
        setattr(diff, side, [r[0] for r in rows])
    return diff
