"""A sink's ledger: what it acknowledged or refused, written with the exporter's offsets in one transaction.

    BEGIN
      export_ledger   one row per (sink, generation): acknowledged | dead-lettered (with the sink's reason)
      export_offsets  compare-and-set expected -> next, per partition of llm.generations
    COMMIT

A seal is sent only when the sink's ledger has no row for it, so a restart, a rebalance or a replay of the
log from offset 0 sends nothing that was acknowledged before, however old. What a crash can repeat is the
batch between the sink's answer and this commit: sent again with the same ids, which each sink deduplicates
over a window (hours at least) far longer than a restart.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg

from projections.export.records import Seal
from projections.lifecycle import LifecycleProjection
from projections.offsets import EXPORTS, advance, load_offsets
from schemas.topics import GENERATIONS


@dataclass(frozen=True)
class Outcome:
    """What a sink answered for one seal; `reason` is None when it acknowledged it."""

    seal: Seal
    reason: str | None = None


def projected_through(conn: psycopg.Connection) -> dict[int, int]:
    """Per partition of llm.generations, the offset the lifecycle projection has committed up to: every seal
    of an earlier terminal event is in `billing_ledger`."""
    return load_offsets(conn, LifecycleProjection.name, GENERATIONS)


def positions(conn: psycopg.Connection, sink: str) -> dict[int, int]:
    return load_offsets(conn, sink, GENERATIONS, EXPORTS)


def recorded(conn: psycopg.Connection, sink: str, generation_ids: Iterable[str]) -> set[str]:
    rows = conn.execute("SELECT generation_id FROM export_ledger WHERE sink = %s AND generation_id = ANY(%s)",
                        (sink, sorted(set(generation_ids)))).fetchall()
    return {row[0] for row in rows}


def record(conn: psycopg.Connection, sink: str, outcomes: list[Outcome]) -> None:
    """Write the outcomes (a row already there stays: the first answer recorded wins)."""
    with conn.cursor() as cur:
        cur.executemany(
            """
            INSERT INTO export_ledger (sink, generation_id, record_id, tenant_id, epoch, billed_input_tokens,
                                       billed_cached_input_tokens, billed_output_tokens, sealed_at, outcome, reason)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING
            """,
            [(sink, o.seal.generation_id, o.seal.record_id, o.seal.tenant_id, o.seal.epoch, o.seal.input_tokens,
              o.seal.cached_input_tokens, o.seal.output_tokens, o.seal.sealed_at,
              "acknowledged" if o.reason is None else "dead-lettered", o.reason) for o in outcomes])


def advance_position(conn: psycopg.Connection, sink: str, partition: int, expected: int | None,
                     next_offset: int) -> None:
    advance(conn, sink, GENERATIONS, partition, expected, next_offset, EXPORTS)


UNEXPORTED = ("SELECT min(b.sealed_at) FILTER (WHERE NOT EXISTS (SELECT 1 FROM export_ledger e WHERE e.sink = %s "
              "AND e.generation_id = b.generation_id)), max(b.sealed_at) FROM billing_ledger b")


def oldest_unexported(conn: psycopg.Connection, sink: str, since: datetime | None = None
                      ) -> tuple[datetime | None, datetime | None]:
    """Among the bills sealed at or after `since` (None: every bill), the seal time of the oldest one the
    sink's ledger has no row for and of the newest one; None where there is none."""
    if since is None:
        row = conn.execute(UNEXPORTED, (sink,)).fetchone()
    else:  # billing_ledger_sealed_at (migration 0008): the rows since, not the ledger
        row = conn.execute(UNEXPORTED + " WHERE b.sealed_at >= %s", (sink, since)).fetchone()
    return row[0], row[1]


@dataclass
class UnexportedFloor:
    """Where the next oldest-unexported measure starts, so that it reads the seals of the last while only.

    Everything sealed before the oldest unexported seal found (or, when none was, before the newest seal)
    was in the sink's ledger then, and a ledger row is never removed. A seal projected later may still carry
    an earlier seal time (partitions are projected apart, a projector may lag): the measure starts `skew`
    before the floor, and every `full_every`-th one reads the whole ledger again.
    """

    skew: timedelta = timedelta(minutes=5)
    full_every: int = 60
    floor: datetime | None = None
    measured: int = 0

    def since(self) -> datetime | None:
        if self.floor is None or self.measured % self.full_every == 0:
            return None
        return self.floor - self.skew

    def observe(self, oldest: datetime | None, newest: datetime | None) -> None:
        self.measured += 1
        self.floor = oldest or newest or self.floor
