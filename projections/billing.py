"""Sealing: when a terminal event is projected, fix the bill from the recorded watermark.

The seal row is written once (a redelivered terminal event finds it and does
nothing) and the database refuses any later change. Compute the worker did
but never recorded — the tail after the last watermark of an interrupted
attempt — is written to reconciliation for the operator, never invoiced.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from projections.usage import watermark


@dataclass(frozen=True)
class SealInput:
    generation_id: str
    tenant_id: str
    epoch: int | None
    model_version: str
    reserved_tokens: int
    end_reason: str
    usage_label: str  # "final" | "interrupted"
    sealed_at: datetime


def seal(conn: psycopg.Connection, s: SealInput) -> bool:
    """Write the sealed bill; False when this generation was already sealed."""
    usage = watermark(conn, s.generation_id, s.epoch)
    used = usage.processed_input_tokens + usage.generated_output_tokens
    inserted = conn.execute(
        """
        INSERT INTO billing_ledger (generation_id, tenant_id, epoch, model_version, end_reason, usage_label,
                                    billed_input_tokens, billed_cached_input_tokens, billed_output_tokens,
                                    reserved_tokens, released_tokens, sealed_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (generation_id) DO NOTHING RETURNING 1
        """,
        (s.generation_id, s.tenant_id, s.epoch, s.model_version, s.end_reason, s.usage_label,
         usage.processed_input_tokens, usage.cached_input_tokens, usage.generated_output_tokens,
         s.reserved_tokens, max(0, s.reserved_tokens - used), s.sealed_at)).fetchone() is not None
    if not inserted:
        return False
    conn.execute(
        """
        INSERT INTO tenant_usage_hourly (tenant_id, hour, generations, input_tokens, cached_input_tokens, output_tokens)
        VALUES (%s, date_trunc('hour', %s::timestamptz AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', 1, %s, %s, %s)
        ON CONFLICT (tenant_id, hour) DO UPDATE SET
            generations = tenant_usage_hourly.generations + 1,
            input_tokens = tenant_usage_hourly.input_tokens + EXCLUDED.input_tokens,
            cached_input_tokens = tenant_usage_hourly.cached_input_tokens + EXCLUDED.cached_input_tokens,
            output_tokens = tenant_usage_hourly.output_tokens + EXCLUDED.output_tokens
        """,
        (s.tenant_id, s.sealed_at, usage.processed_input_tokens, usage.cached_input_tokens,
         usage.generated_output_tokens))
    if s.usage_label == "interrupted":
        lock_generations(conn, [s.generation_id])
        refresh_unbilled_tail(conn, s.generation_id)
    return True


def lock_generations(conn: psycopg.Connection, generation_ids: list[str]) -> None:
    """Serialize the stream and lifecycle projections on one generation's tail (sorted: no lock cycles)."""
    for generation_id in sorted(set(generation_ids)):
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (generation_id,))


def refresh_unbilled_tail(conn: psycopg.Connection, generation_id: str) -> None:
    """Streamed-but-unrecorded output of an interrupted attempt.

    Recomputed from both tables whenever either side moves, and only ever
    raised, so the final value does not depend on which projection ran first.
    """
    conn.execute(
        """
        INSERT INTO usage_reconciliation (generation_id, epoch, kind, report_seq, tenant_id,
                                          generated_output_tokens, recorded_at)
        SELECT b.generation_id, b.epoch, 'unbilled_tail', 0, b.tenant_id,
               sp.token_count - b.billed_output_tokens, GREATEST(b.sealed_at, sp.updated_at)
        FROM billing_ledger b
        JOIN stream_progress sp ON sp.generation_id = b.generation_id AND sp.epoch = b.epoch
        WHERE b.generation_id = %s AND b.usage_label = 'interrupted' AND sp.token_count > b.billed_output_tokens
        ON CONFLICT (generation_id, epoch, kind, report_seq) DO UPDATE SET
            generated_output_tokens = GREATEST(usage_reconciliation.generated_output_tokens,
                                               EXCLUDED.generated_output_tokens),
            recorded_at = GREATEST(usage_reconciliation.recorded_at, EXCLUDED.recorded_at)
        """,
        (generation_id,))
