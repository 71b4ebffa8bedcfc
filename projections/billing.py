"""Sealing: when a terminal event is projected, fix the bill from the recorded watermark.

The seal row is written once (a redelivered terminal event finds it and does
nothing) and the database refuses any later change. Compute the worker did
but never recorded — the tail after the last watermark of an interrupted
attempt — is written to reconciliation for the operator, never invoiced.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg

from projections.statements import place_seals
from schemas.values import Usage


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
    usage: Usage  # the attempt's recorded watermark at the seal


def seal_all(conn: psycopg.Connection, seals: Sequence[SealInput]) -> set[str]:
    """Write the sealed bills of distinct generations; the ids sealed now (the others were sealed before).

    One INSERT for the bills, one upsert for the hourly totals of the bills written (summed per tenant and
    hour first: one statement may not update a row twice; the totals are sums, so order does not matter).
    """
    if not seals:
        return set()
    rows = conn.execute(INSERT_BILLS, [
        [s.generation_id for s in seals], [s.tenant_id for s in seals], [s.epoch for s in seals],
        [s.model_version for s in seals], [s.end_reason for s in seals], [s.usage_label for s in seals],
        [s.usage.processed_input_tokens for s in seals], [s.usage.cached_input_tokens for s in seals],
        [s.usage.generated_output_tokens for s in seals], [s.reserved_tokens for s in seals],
        [max(0, s.reserved_tokens - s.usage.processed_input_tokens - s.usage.generated_output_tokens)
         for s in seals],
        [s.sealed_at for s in seals]]).fetchall()
    sealed = {row[0] for row in rows}
    new = [s for s in seals if s.generation_id in sealed]
    place_seals(conn, [(s.generation_id, s.tenant_id, s.sealed_at) for s in new])
    if new:
        conn.execute(ADD_HOURLY, [
            [s.tenant_id for s in new], [s.sealed_at for s in new], [s.usage.processed_input_tokens for s in new],
            [s.usage.cached_input_tokens for s in new], [s.usage.generated_output_tokens for s in new]])
    interrupted = [s.generation_id for s in new if s.usage_label == "interrupted"]
    if interrupted:
        lock_generations(conn, interrupted)
        for generation_id in interrupted:
            refresh_unbilled_tail(conn, generation_id)
    return sealed


INSERT_BILLS = """
    INSERT INTO billing_ledger (generation_id, tenant_id, epoch, model_version, end_reason, usage_label,
                                billed_input_tokens, billed_cached_input_tokens, billed_output_tokens,
                                reserved_tokens, released_tokens, sealed_at)
    SELECT * FROM unnest(%s::text[], %s::text[], %s::int[], %s::text[], %s::text[], %s::text[], %s::bigint[],
                         %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::timestamptz[])
    ON CONFLICT (generation_id) DO NOTHING RETURNING generation_id
    """

ADD_HOURLY = """
    INSERT INTO tenant_usage_hourly (tenant_id, hour, generations, input_tokens, cached_input_tokens, output_tokens)
    SELECT tenant_id, date_trunc('hour', sealed_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', count(*),
           sum(input_tokens), sum(cached_input_tokens), sum(output_tokens)
    FROM unnest(%s::text[], %s::timestamptz[], %s::bigint[], %s::bigint[], %s::bigint[])
         AS s(tenant_id, sealed_at, input_tokens, cached_input_tokens, output_tokens)
    GROUP BY 1, 2
    ON CONFLICT (tenant_id, hour) DO UPDATE SET
        generations = tenant_usage_hourly.generations + EXCLUDED.generations,
        input_tokens = tenant_usage_hourly.input_tokens + EXCLUDED.input_tokens,
        cached_input_tokens = tenant_usage_hourly.cached_input_tokens + EXCLUDED.cached_input_tokens,
        output_tokens = tenant_usage_hourly.output_tokens + EXCLUDED.output_tokens
    """


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
