"""The `generations` projection: llm.generations -> status, attempts, usage, sealed billing.

One projection (one offset) owns every table fed by the lifecycle topic, so a
seal always sees the watermarks that precede it in the log.

    admitted ──AttemptStarted──► running ──► completed | canceled | interrupted | expired | failed
        └──────────────────────────────────► canceled | expired | rejected

The first terminal event wins; a terminal or start event of an older epoch
only closes that attempt's row. Reports of any epoch land on their own
(generation, epoch) watermark, so epoch 2 never raises epoch 1's numbers.
"""
from __future__ import annotations

from collections.abc import Sequence

import psycopg

from projections.billing import SealInput, seal
from projections.usage import raise_watermark, record_report, watermark
from schemas.envelope import Envelope
from schemas.lifecycle import (
    Admitted, AttemptStarted, CancelRequested, Canceled, Completed, Expired, Failed, Interrupted, Rejected,
    UsageReported,
)
from schemas.topics import GENERATIONS

TERMINAL_STATUS = {Completed: "completed", Canceled: "canceled", Interrupted: "interrupted",
                   Expired: "expired", Failed: "failed", Rejected: "rejected"}
FINISHED = tuple(TERMINAL_STATUS.values())


class LifecycleProjection:
    name = "generations"
    topic = GENERATIONS

    def tables(self) -> tuple[str, ...]:
        return ("generations", "attempts", "usage_watermarks", "usage_reports", "billing_ledger",
                "usage_reconciliation", "tenant_usage_hourly")

    def apply(self, conn: psycopg.Connection, events: Sequence[Envelope]) -> None:
        # Pipelined: statements stream to the server in log order; only a terminal event waits
        # for an answer (it reads the generation row before sealing).
        with conn.pipeline():
            for event in events:
                handler = HANDLERS.get(type(event))
                if handler is not None:
                    handler(conn, event)


def on_admitted(conn: psycopg.Connection, e: Admitted) -> None:
    conn.execute(
        """
        INSERT INTO generations (generation_id, tenant_id, request_id, model_version, status, tier, current_epoch,
                                 input_tokens, max_output_tokens, reserved_tokens, payload_hash,
                                 admitted_at, updated_at)
        VALUES (%s, %s, %s, %s, 'admitted', %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (generation_id) DO NOTHING
        """,
        (e.generation_id, e.tenant_id, e.request_id, e.model_version, e.tier, e.epoch, e.input_tokens,
         e.max_output_tokens, e.reserved_tokens, e.payload_hash, e.occurred_at, e.occurred_at))


def on_attempt_started(conn: psycopg.Connection, e: AttemptStarted) -> None:
    conn.execute(
        "INSERT INTO attempts (generation_id, epoch, worker_id, started_at) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING", (e.generation_id, e.epoch, e.worker_id, e.occurred_at))
    conn.execute(
        f"""
        UPDATE generations SET status = 'running', current_epoch = %s, worker_id = %s,
               started_at = COALESCE(started_at, %s), updated_at = %s
        WHERE generation_id = %s AND status NOT IN {FINISHED}
          AND (current_epoch IS NULL OR current_epoch <= %s)
        """,
        (e.epoch, e.worker_id, e.occurred_at, e.occurred_at, e.generation_id, e.epoch))


def on_cancel_requested(conn: psycopg.Connection, e: CancelRequested) -> None:
    conn.execute(
        f"UPDATE generations SET cancel_requested = true, updated_at = %s "
        f"WHERE generation_id = %s AND status NOT IN {FINISHED} AND NOT cancel_requested",
        (e.occurred_at, e.generation_id))


def on_usage_reported(conn: psycopg.Connection, e: UsageReported) -> None:
    record_report(conn, e)
    refresh_summary(conn, e.generation_id)


def refresh_summary(conn: psycopg.Connection, generation_id: str) -> None:
    """The status row shows the current attempt's watermark (never another epoch's)."""
    conn.execute(
        f"""
        UPDATE generations g SET processed_input_tokens = w.processed_input_tokens,
               cached_input_tokens = w.cached_input_tokens, generated_output_tokens = w.generated_output_tokens
        FROM usage_watermarks w
        WHERE g.generation_id = %s AND w.generation_id = g.generation_id AND w.epoch = g.current_epoch
          AND g.status NOT IN {FINISHED}
        """, (generation_id,))


def on_terminal(conn: psycopg.Connection, e: Envelope) -> None:
    status = TERMINAL_STATUS[type(e)]
    row = conn.execute(
        "SELECT status, current_epoch, model_version, reserved_tokens FROM generations WHERE generation_id = %s "
        "FOR UPDATE", (e.generation_id,)).fetchone()
    epoch = e.epoch if e.epoch is not None else (row[1] if row else None)
    end_reason = end_reason_of(e)
    if epoch is not None:
        conn.execute("UPDATE attempts SET ended_at = %s, end_reason = %s "
                     "WHERE generation_id = %s AND epoch = %s AND ended_at IS NULL",
                     (e.occurred_at, end_reason, e.generation_id, epoch))
    if row is None or row[0] in FINISHED:
        return  # never admitted here, or already ended: the first terminal event wins
    if e.epoch is not None and row[1] is not None and e.epoch < row[1]:
        return  # a stale attempt ended; the current one goes on
    usage = getattr(e, "usage", None)
    if usage is not None and epoch is not None:
        # The worker's terminal usage is its final watermark, durable in the same log.
        raise_watermark(conn, e.tenant_id, e.generation_id, epoch, usage, e.occurred_at)
    final = watermark(conn, e.generation_id, epoch)
    conn.execute(
        """
        UPDATE generations SET status = %s, end_reason = %s, ended_at = %s, updated_at = %s, current_epoch = %s,
               processed_input_tokens = %s, cached_input_tokens = %s, generated_output_tokens = %s
        WHERE generation_id = %s
        """,
        (status, end_reason, e.occurred_at, e.occurred_at, epoch, final.processed_input_tokens,
         final.cached_input_tokens, final.generated_output_tokens, e.generation_id))
    seal(conn, SealInput(
        generation_id=e.generation_id, tenant_id=e.tenant_id, epoch=epoch, model_version=row[2],
        reserved_tokens=row[3], end_reason=end_reason,
        usage_label="interrupted" if isinstance(e, Interrupted) else "final", sealed_at=e.occurred_at))


def end_reason_of(e: Envelope) -> str:
    """The client-facing end reason (DESIGN.md §4): completed, output-limit, canceled, interrupted, ..."""
    if isinstance(e, Completed):
        return "output-limit" if e.finish_reason == "length" else "completed"
    return TERMINAL_STATUS[type(e)]


HANDLERS = {
    Admitted: on_admitted,
    AttemptStarted: on_attempt_started,
    CancelRequested: on_cancel_requested,
    UsageReported: on_usage_reported,
    **{kind: on_terminal for kind in TERMINAL_STATUS},
}
