"""Usage watermarks per (generation, epoch): cumulative, monotonic, each report counted once.

    report (gen, epoch, seq) ──► usage_reports  (PK conflict = already counted)
                              └► usage_watermarks  GREATEST(stored, reported) per counter
    after the seal            ──► usage_reconciliation 'post_seal_report' (never invoiced)
"""
from __future__ import annotations

import psycopg

from schemas.lifecycle import UsageReported
from schemas.values import Usage

COUNTERS = ("processed_input_tokens", "cached_input_tokens", "generated_output_tokens", "recompute_tokens")


def record_report(conn: psycopg.Connection, event: UsageReported) -> None:
    """Count a report once: raise its watermark, or, after the seal, note it for reconciliation.

    One statement (data-modifying CTEs), so a batch of reports can be pipelined
    without a round trip per report.
    """
    counts = tuple(getattr(event.usage, c) for c in COUNTERS)
    conn.execute(
        f"""
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
        """,
        {"g": event.generation_id, "e": event.epoch, "seq": event.report_seq, "t": event.tenant_id,
         "c0": counts[0], "c1": counts[1], "c2": counts[2], "c3": counts[3], "at": event.occurred_at})


def raise_watermark(conn: psycopg.Connection, tenant_id: str, generation_id: str, epoch: int, usage: Usage,
                    at, counted: int = 0) -> None:
    """Merge a cumulative usage into the (generation, epoch) watermark; counters never go down."""
    conn.execute(
        f"""
        INSERT INTO usage_watermarks (generation_id, epoch, tenant_id, {", ".join(COUNTERS)},
                                      reports_counted, updated_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (generation_id, epoch) DO UPDATE SET
            {", ".join(f"{c} = GREATEST(usage_watermarks.{c}, EXCLUDED.{c})" for c in COUNTERS)},
            reports_counted = usage_watermarks.reports_counted + EXCLUDED.reports_counted,
            updated_at = GREATEST(usage_watermarks.updated_at, EXCLUDED.updated_at)
        """,
        (generation_id, epoch, tenant_id, *(getattr(usage, c) for c in COUNTERS), counted, at))


def watermark(conn: psycopg.Connection, generation_id: str, epoch: int | None) -> Usage:
    if epoch is None:
        return Usage()
    row = conn.execute(f"SELECT {', '.join(COUNTERS)} FROM usage_watermarks WHERE generation_id = %s AND epoch = %s",
                       (generation_id, epoch)).fetchone()
    return Usage(**dict(zip(COUNTERS, row))) if row else Usage()
