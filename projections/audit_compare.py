"""Comparing a live read model with its replay: one hash per table first, rows only where hashes differ.

A table's hash is the row count and the sum of a 64-bit hash of each row's text (order-free, and a
row repeated counts twice), so two tables hash alike when they hold the same rows. The row hash is
PostgreSQL's `hashtextextended`, several times cheaper than md5 here: a screen against accidental or
mistaken change, not a proof against someone crafting collisions (who could edit the checkpoint too). Only a table whose
hash differs is copied out of the live snapshot and compared row by row (EXCEPT ALL both ways).

Resume buffers are compared as if log-time trimming had finished on both sides: the live trimmer works
in bounded batches and may not have reached a stream a replay has trimmed (or the other way round).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import psycopg

MAX_ROWS_SHOWN = 20
# Tables shared by every projection (a `projection` column): only the audited projections' rows count.
PER_PROJECTION = ("projection_offsets", "refused_events")
# Row text is the thing hashed: pin what shapes it, so a hash stored by one audit matches the next.
SESSION = ("SET TimeZone = 'UTC'", "SET DateStyle = 'ISO'", "SET bytea_output = 'hex'",
           "SET extra_float_digits = 1", "SET IntervalStyle = 'postgres'")


@dataclass(frozen=True)
class TableHash:
    rows: int
    digest: int


@dataclass
class TableDiff:
    live_only: list[str] = field(default_factory=list)
    shadow_only: list[str] = field(default_factory=list)
    live_only_count: int = 0
    shadow_only_count: int = 0


def pin_session(conn: psycopg.Connection) -> None:
    for statement in SESSION:
        conn.execute(statement)


def rows_of(schema: str, table: str, keep_after_end: timedelta | None) -> str:
    """The query for a table's compared rows (parameters `projections`, `keep`): buffers as if trimmed."""
    s = f'"{schema}"'
    if table in PER_PROJECTION:
        return f"SELECT * FROM {s}.{table} t WHERE projection = ANY(%(projections)s)"
    if keep_after_end is None or table not in ("stream_events", "stream_progress"):
        return f"SELECT * FROM {s}.{table} t"
    cutoff = f"(SELECT max(updated_at) FROM {s}.stream_progress) - %(keep)s"
    if table == "stream_progress":
        return (f"SELECT (CASE WHEN t.ended_at < {cutoff} AND t.oldest_seq <= t.last_seq "
                f"THEN jsonb_populate_record(t, jsonb_build_object('oldest_seq', t.last_seq + 1)) ELSE t END).* "
                f"FROM {s}.stream_progress t")
    return (f"SELECT t.* FROM {s}.stream_events t WHERE NOT EXISTS (SELECT 1 FROM {s}.stream_progress p "
            f"WHERE p.generation_id = t.generation_id AND p.ended_at < {cutoff})")


class Comparer:
    """Hashes and row diffs of the audited tables, for the projections named, in any schema."""

    def __init__(self, tables: list[str], projections: list[str], keep_after_end: timedelta | None) -> None:
        self.tables = tables
        self.params = {"projections": projections, "keep": keep_after_end}
        self.keep_after_end = keep_after_end

    def hashes(self, conn: psycopg.Connection, schema: str) -> dict[str, TableHash]:
        out = {}
        for table in self.tables:
            query = rows_of(schema, table, self.keep_after_end)
            rows, digest = conn.execute(
                f"SELECT count(*), coalesce(sum(hashtextextended(r::text, 0)::numeric), 0) "
                f"FROM ({query}) r", self.params).fetchone()
            out[table] = TableHash(rows, int(digest))
        return out

    def copy(self, conn: psycopg.Connection, source: str, target: str, tables: list[str]) -> None:
        """The compared rows of `tables` from schema `source` into new tables in schema `target`."""
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{target}"')
        for table in tables:
            query = rows_of(source, table, self.keep_after_end)
            conn.execute(f'CREATE TABLE "{target}".{table} AS {query}', self.params)

    def diff(self, conn: psycopg.Connection, live: str, shadow: str, table: str) -> TableDiff:
        """Rows on one side only; `live` holds the copied rows, `shadow` the replay (compared rows of it)."""
        diff = TableDiff()
        replayed = rows_of(shadow, table, self.keep_after_end)
        sides = {"live_only": (f'SELECT * FROM "{live}".{table}', replayed),
                 "shadow_only": (replayed, f'SELECT * FROM "{live}".{table}')}
        for side, (a, b) in sides.items():
            query = f"{a} EXCEPT ALL {b}"
            count = conn.execute(f"SELECT count(*) FROM ({query}) d", self.params).fetchone()[0]
            rows = conn.execute(f"SELECT d::text FROM ({query}) d ORDER BY 1 LIMIT {MAX_ROWS_SHOWN}",
                                self.params).fetchall()
            setattr(diff, f"{side}_count", count)
            setattr(diff, side, [r[0] for r in rows])
        return diff
