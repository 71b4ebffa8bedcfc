"""Consumer offsets stored next to the rows they produced, with compare-and-set.

A projection writes its rows and `projection_offsets` in one transaction (an exporter its sink ledger and
`export_offsets`). The offset update names the offset it expects to replace; a consumer that lost its
partition in a rebalance (and so expects an older offset) updates zero rows, raises StaleOffset, and its
whole transaction rolls back.
"""
from __future__ import annotations

from dataclasses import dataclass

import psycopg


class StaleOffset(Exception):
    """Another consumer already advanced this partition: apply nothing."""


@dataclass(frozen=True)
class OffsetTable:
    """A table of (owner, topic, partition) -> next offset; `owner` names the column of the consumer's name."""

    name: str
    owner: str


PROJECTIONS = OffsetTable("projection_offsets", "projection")
EXPORTS = OffsetTable("export_offsets", "sink")


def load_offsets(conn: psycopg.Connection, projection: str, topic: str,
                 table: OffsetTable = PROJECTIONS) -> dict[int, int]:
    rows = conn.execute(
        f"SELECT partition, next_offset FROM {table.name} WHERE {table.owner} = %s AND topic = %s",
        (projection, topic),
    ).fetchall()
    return {partition: offset for partition, offset in rows}


def advance(conn: psycopg.Connection, projection: str, topic: str, partition: int,
            expected: int | None, next_offset: int, table: OffsetTable = PROJECTIONS) -> None:
    """Move the stored offset from `expected` (None: no row yet) to `next_offset`, or raise StaleOffset."""
    if expected is None:
        cur = conn.execute(
            f"INSERT INTO {table.name} ({table.owner}, topic, partition, next_offset) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING", (projection, topic, partition, next_offset))
    else:
        cur = conn.execute(
            f"UPDATE {table.name} SET next_offset = %s "
            f"WHERE {table.owner} = %s AND topic = %s AND partition = %s AND next_offset = %s",
            (next_offset, projection, topic, partition, expected))
    if cur.rowcount != 1:
        raise StaleOffset(f"{projection} {topic}[{partition}]: expected offset {expected} is no longer current")
