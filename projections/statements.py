"""Statements, projected with the bills they are made of (part of the `generations` projection).

    seal (billing.py) ──► statement_items: billed in the first period from its own still open in its partition
    PeriodClosed(P, p) ──► billing_period_marks (P, p)
        └─ the last partition's marker ──► statements + statement_totals of every tenant billed in P,
                                           billing_periods (P): closed

Both sides are decided by the order of one partition of `llm.generations`, so a replay makes the same
rows whatever order the partitions are applied in: a seal reads only its own partition's markers (its
partition is the one its generation id hashes to, as every producer keys it), and the statement of a
period is made once, when no partition can add a seal to it any more.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

import psycopg

from plumbing.kafka.follower import partition_for
from projections.periods import Period, billed_in
from projections.statement_lines import METERS, LineItem, Statement
from schemas.billing_periods import PeriodClosed

log = logging.getLogger(__name__)


class ClosedPeriods:
    """The markers projected so far: per partition, the periods closed there."""

    def __init__(self, rows: Sequence[tuple[str, int, int]]) -> None:
        self.partitions = rows[0][2] if rows else None
        self.by_partition: dict[int, set[Period]] = {}
        for period, partition, _ in rows:
            self.by_partition.setdefault(partition, set()).add(Period.parse(period))

    def closed_for(self, generation_id: str) -> set[Period]:
        """The periods closed in the partition of this generation's records."""
        if self.partitions is None:
            return set()  # no marker anywhere: nothing is closed in any partition
        return self.by_partition.get(partition_for(generation_id, self.partitions), set())


def closed_periods(conn: psycopg.Connection) -> ClosedPeriods:
    return ClosedPeriods(conn.execute("SELECT period, partition, partitions FROM billing_period_marks "
                                      "ORDER BY period, partition").fetchall())


def place_seals(conn: psycopg.Connection, seals: Sequence[tuple[str, str, datetime]]) -> None:
    """Put each newly sealed (generation id, tenant id, sealed at) on the statement of the period it is billed in."""
    if not seals:
        return
    closed = closed_periods(conn)
    rows = []
    for generation_id, tenant_id, sealed_at in seals:
        # A record's time without an offset is taken as UTC: raising here would wedge the projection on it.
        home = Period.of(sealed_at if sealed_at.tzinfo else sealed_at.replace(tzinfo=UTC))
        rows.append((generation_id, tenant_id, str(billed_in(home, closed.closed_for(generation_id))), str(home)))
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO statement_items (generation_id, tenant_id, period, belongs_to) "
                        "VALUES (%s, %s, %s, %s) ON CONFLICT (generation_id) DO NOTHING", rows)


def on_period_closed(conn: psycopg.Connection, marker: PeriodClosed) -> None:
    """Record the marker (the first of its period and partition wins); the last one makes the statements."""
    conn.execute("INSERT INTO billing_period_marks (period, partition, partitions, close_id, closed_at) "
                 "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (period, partition) DO NOTHING",
                 (marker.period, marker.partition, marker.partitions, marker.close_id, marker.occurred_at))
    marked, closed_at = conn.execute("SELECT count(*), max(closed_at) FROM billing_period_marks WHERE period = %s",
                                     (marker.period,)).fetchone()
    already = conn.execute("SELECT 1 FROM billing_periods WHERE period = %s", (marker.period,)).fetchone()
    if marked >= marker.partitions and already is None:
        make_statements(conn, marker.period, marker.partitions, closed_at)


ITEMS_SQL = """
    SELECT i.tenant_id, b.generation_id, b.epoch, b.model_version, b.usage_label, b.end_reason, b.sealed_at,
           i.belongs_to, b.billed_input_tokens, b.billed_cached_input_tokens, b.billed_output_tokens
    FROM statement_items i JOIN billing_ledger b USING (generation_id)
    WHERE i.period = %s {tenant}
    """


def items_of(conn: psycopg.Connection, period: str, tenant_id: str | None = None) -> dict[str, list[LineItem]]:
    """tenant id -> the line items billed in `period` (one tenant's when given)."""
    sql = ITEMS_SQL.format(tenant="AND i.tenant_id = %s" if tenant_id else "")
    by_tenant: dict[str, list[LineItem]] = {}
    for tenant, *fields in conn.execute(sql, (period, tenant_id) if tenant_id else (period,)):
        by_tenant.setdefault(tenant, []).append(LineItem(*fields))
    return by_tenant


def make_statements(conn: psycopg.Connection, period: str, partitions: int, closed_at: datetime) -> None:
    """Every tenant's statement of `period`, written once, and the period closed."""
    statements = [Statement.of(tenant, period, closed_at, items)
                  for tenant, items in sorted(items_of(conn, period).items())]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO statements (tenant_id, period, closed_at, generations, late_generations, line_items_sha256) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            [(s.tenant_id, period, closed_at, s.generations, s.late_generations, s.line_items_sha256)
             for s in statements])
        cur.executemany(
            "INSERT INTO statement_totals (tenant_id, period, model_version, meter, generations, quantity) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            [(s.tenant_id, period, total.model_version, meter, total.generations, total.quantities[meter])
             for s in statements for total in s.totals for meter in METERS])
    conn.execute("INSERT INTO billing_periods (period, closed_at, partitions, tenants, generations) "
                 "VALUES (%s, %s, %s, %s, %s)",
                 (period, closed_at, partitions, len(statements), sum(s.generations for s in statements)))
    log.info("billing period closed period=%s tenants=%d generations=%d", period, len(statements),
             sum(s.generations for s in statements))
