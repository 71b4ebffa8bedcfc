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


def is_sealed(conn: psycopg.Connection, generation_id: str) -> bool:
    return conn.execute("SELECT 1 FROM billing_ledger WHERE generation_id = %s",
                        (generation_id,)).fetchone() is not None


def record_report(conn: psycopg.Connection, event: UsageReported) -> None:
    first_time = conn.execute(
        "INSERT INTO usage_reports (generation_id, epoch, report_seq) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
        (event.generation_id, event.epoch, event.report_seq)).rowcount == 1
    if not first_time:
        return
    if is_sealed(conn, event.generation_id):
        record_post_seal(conn, event)
        return
    raise_watermark(conn, event.tenant_id, event.generation_id, event.epoch, event.usage, event.occurred_at,
                    counted=1)


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


def record_post_seal(conn: psycopg.Connection, event: UsageReported) -> None:
    conn.execute(
        f"""
        INSERT INTO usage_reconciliation (generation_id, epoch, kind, report_seq, tenant_id,
                                          {", ".join(COUNTERS)}, recorded_at)
        VALUES (%s, %s, 'post_seal_report', %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT DO NOTHING
        """,
        (event.generation_id, event.epoch, event.report_seq, event.tenant_id,
         *(getattr(event.usage, c) for c in COUNTERS), event.occurred_at))


def watermark(conn: psycopg.Connection, generation_id: str, epoch: int | None) -> Usage:
    if epoch is None:
        return Usage()
    row = conn.execute(f"SELECT {', '.join(COUNTERS)} FROM usage_watermarks WHERE generation_id = %s AND epoch = %s",
                       (generation_id, epoch)).fetchone()
    return Usage(**dict(zip(COUNTERS, row))) if row else Usage()
