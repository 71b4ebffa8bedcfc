"""What the platform wrote to PostgreSQL in a window, and when the projector has applied everything.

Rows written per table come from `pg_stat_user_tables` (n_tup_ins, n_tup_upd, n_tup_del). A backend
publishes its counters at most once a second when it goes idle, and an idle backend with counters still
pending publishes them by a timer 10 s later (PGSTAT_IDLE_INTERVAL; `pg_stat_force_next_flush()` flushes only
the calling backend): a snapshot is taken once the counters have not moved for `QUIET_S`, longer than
that timer, so nothing written before it can still be pending.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import psycopg

from bench.overhead.kafka import partition_end_offsets

QUIET_S = 11.0

Counts = dict[str, tuple[int, int, int]]  # table -> (inserted, updated, deleted)


@dataclass(frozen=True)
class RowSnapshot:
    tables: Counts
    wal_lsn_bytes: int
    settle_s: float = 0.0


def read_rows(conn: psycopg.Connection) -> RowSnapshot:
    rows = conn.execute("SELECT schemaname, relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables"
                        ).fetchall()
    lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]
    tables: Counts = {}
    for schema, table, ins, upd, dele in rows:
        name = table_name(schema, table)
        tables[name] = tuple(a + int(b) for a, b in zip(tables.get(name, (0, 0, 0)), (ins, upd, dele)))
    return RowSnapshot(tables, int(lsn))


def table_name(schema: str, table: str) -> str:
    """`public.generations`; a temporary table's schema (`pg_temp_3`, one per backend) is named `pg_temp`,
    so its rows add up across backends and runs."""
    return f"{'pg_temp' if schema.startswith('pg_temp_') else schema}.{table}"


async def settled_rows(database_url: str, quiet_s: float = QUIET_S, poll_s: float = 0.5,
                       timeout_s: float = 120.0) -> RowSnapshot:
    """Counters once unchanged for `quiet_s` (RuntimeError when they still move after `timeout_s`)."""
    started = time.monotonic()
    with psycopg.connect(database_url, autocommit=True) as conn:
        last = read_rows(conn)
        stable_since = time.monotonic()
        while time.monotonic() - stable_since < quiet_s:
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"pg_stat_user_tables still changing after {timeout_s:.0f}s")
            await asyncio.sleep(poll_s)
            now = read_rows(conn)
            if now.tables != last.tables:
                last, stable_since = now, time.monotonic()
    return RowSnapshot(last.tables, last.wal_lsn_bytes, round(time.monotonic() - started, 2))


def row_deltas(before: Counts, after: Counts) -> dict[str, dict[str, int]]:
    """Rows inserted, updated, deleted and written (their sum) per table; unchanged tables left out."""
    deltas = {}
    for table in sorted(after):
        ins, upd, dele = (a - b for a, b in zip(after[table], before.get(table, (0, 0, 0))))
        if ins or upd or dele:
            deltas[table] = {"inserted": ins, "updated": upd, "deleted": dele, "written": ins + upd + dele}
    return deltas


def projector_positions(conn: psycopg.Connection) -> dict[tuple[str, int], int]:
    rows = conn.execute("SELECT topic, partition, max(next_offset) FROM projection_offsets "
                        "GROUP BY topic, partition").fetchall()
    return {(topic, partition): int(offset) for topic, partition, offset in rows}


def caught_up(positions: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]) -> bool:
    """Every partition the projector tracks is at its end; one short is allowed, since a transaction's
    commit marker takes the last offset and is never applied."""
    return all(end == 0 if tp not in positions else positions[tp] >= end - 1 for tp, end in ends.items())


async def wait_projected(database_url: str, bootstrap: str, poll_s: float = 0.5, timeout_s: float = 120.0) -> float:
    """Wait until the projector has applied every record of its topics and its positions held still for one
    poll; returns the seconds waited."""
    started = time.monotonic()
    with psycopg.connect(database_url, autocommit=True) as conn:
        previous = None
        while time.monotonic() - started < timeout_s:
            positions = projector_positions(conn)
            topics = sorted({topic for topic, _ in positions})
            if positions == previous and caught_up(positions, await partition_end_offsets(bootstrap, topics)):
                return round(time.monotonic() - started, 2)
            previous = positions
            await asyncio.sleep(poll_s)
    raise RuntimeError(f"the projector did not catch up within {timeout_s:.0f}s")
