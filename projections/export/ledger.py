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


def oldest_unexported(conn: psycopg.Connection, sink: str):
    """The seal time of the oldest bill the sink's ledger has no row for (None: every one is there)."""
    return conn.execute(
        "SELECT min(b.sealed_at) FROM billing_ledger b WHERE NOT EXISTS "
        "(SELECT 1 FROM export_ledger e WHERE e.sink = %s AND e.generation_id = b.generation_id)",
        (sink,)).fetchone()[0]
