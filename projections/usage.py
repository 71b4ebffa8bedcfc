"""Usage watermarks per (generation, epoch): cumulative, monotonic, each report counted once.

    report (gen, epoch, seq) ──► usage_reports  (PK conflict = already counted)
                              └► usage_watermarks  GREATEST(stored, reported) per counter
    after the seal            ──► usage_reconciliation 'post_seal_report' (never invoiced)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg

from schemas.lifecycle import UsageReported
from schemas.values import Usage

COUNTERS = ("processed_input_tokens", "cached_input_tokens", "generated_output_tokens", "recompute_tokens")


def record_reports(conn: psycopg.Connection, events: Sequence[UsageReported]) -> None:
    """Count each report once: raise its watermark, or, after the seal, note it for reconciliation.

    One statement per report (data-modifying CTEs) sent as one pipelined `executemany`: no round trip
    per report, and the reports of one generation still apply in log order.
    """
    with conn.cursor() as cur:
        cur.executemany(RECORD_REPORT, [
            {"g": e.generation_id, "e": e.epoch, "seq": e.report_seq, "t": e.tenant_id,
             **{f"c{i}": getattr(e.usage, c) for i, c in enumerate(COUNTERS)}, "at": e.occurred_at}
            for e in events])


RECORD_REPORT = f"""
    WITH fresh AS (
        INSERT INTO usage_reports (generation_id, epoch, report_seq) VALUES (%(g)s, %(e)s, %(seq)s)
        ON CONFLICT DO NOTHING RETURNING 1
    ), sealed AS (
        SELECT 1 FROM billing_ledger WHERE generation_id = %(g)s
    ), raised AS (
        INSERT INTO usage_watermarks (generation_id, epoch, tenant_id, {", ".join(COUNTERS)},
                                      reports_counted, updated_at)
        SELECT %(g)s, %(e)s, %(t)s, %(c0)s, %(c1)s, %(c2)s, %(c3)s, 1, %(at)s
        WHERE EXISTS (SELECT 1 FROM fresh) AND NOT EXISTS (SELECT 1 FROM sealed)
        ON CONFLICT (generation_id, epoch) DO UPDATE SET
            {", ".join(f"{c} = GREATEST(usage_watermarks.{c}, EXCLUDED.{c})" for c in COUNTERS)},
            reports_counted = usage_watermarks.reports_counted + 1,
            updated_at = GREATEST(usage_watermarks.updated_at, EXCLUDED.updated_at)
    )
    INSERT INTO usage_reconciliation (generation_id, epoch, kind, report_seq, tenant_id,
                                      {", ".join(COUNTERS)}, recorded_at)
    SELECT %(g)s, %(e)s, 'post_seal_report', %(seq)s, %(t)s, %(c0)s, %(c1)s, %(c2)s, %(c3)s, %(at)s
    WHERE EXISTS (SELECT 1 FROM fresh) AND EXISTS (SELECT 1 FROM sealed)
    ON CONFLICT DO NOTHING
    """


@dataclass(frozen=True)
class Raise:
    """A cumulative usage to merge into the (generation, epoch) watermark."""

    tenant_id: str
    generation_id: str
    epoch: int
    usage: Usage
    at: datetime


def raise_watermarks(conn: psycopg.Connection, raises: Sequence[Raise]) -> None:
    """Merge cumulative usages into their watermarks (counters never go down), pipelined."""
    with conn.cursor() as cur:
        cur.executemany(RAISE_WATERMARK, [(r.generation_id, r.epoch, r.tenant_id,
                                           *(getattr(r.usage, c) for c in COUNTERS), 0, r.at) for r in raises])


RAISE_WATERMARK = f"""
    INSERT INTO usage_watermarks (generation_id, epoch, tenant_id, {", ".join(COUNTERS)},
                                  reports_counted, updated_at)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT (generation_id, epoch) DO UPDATE SET
        {", ".join(f"{c} = GREATEST(usage_watermarks.{c}, EXCLUDED.{c})" for c in COUNTERS)},
        reports_counted = usage_watermarks.reports_counted + EXCLUDED.reports_counted,
        updated_at = GREATEST(usage_watermarks.updated_at, EXCLUDED.updated_at)
    """


def watermarks(conn: psycopg.Connection, keys: Sequence[tuple[str, int | None]]) -> dict[tuple[str, int | None], Usage]:
    """The recorded watermark of each (generation, epoch), in one query; absent ones (and epoch None) are zero."""
    wanted = [(g, e) for g, e in keys if e is not None]
    found: dict[tuple[str, int | None], Usage] = {}
    if wanted:
        rows = conn.execute(
            f"SELECT w.generation_id, w.epoch, {', '.join('w.' + c for c in COUNTERS)} FROM usage_watermarks w "
            "JOIN unnest(%s::text[], %s::int[]) AS k(generation_id, epoch) USING (generation_id, epoch)",
            ([g for g, _ in wanted], [e for _, e in wanted])).fetchall()
        found = {(r[0], r[1]): Usage(**dict(zip(COUNTERS, r[2:]))) for r in rows}
    return {key: found.get(key, Usage()) for key in keys}
