"""The `generations` projection: llm.generations -> status, attempts, usage, sealed billing.

One projection (one offset) owns every table fed by the lifecycle topic, so a
seal always sees the watermarks that precede it in the log.

    admitted ──AttemptStarted──► running ──► completed | canceled | interrupted | expired | failed
        └──────────────────────────────────► canceled | expired | rejected

The first terminal event wins; a terminal or start event of an older epoch
only closes that attempt's row. Reports of any epoch land on their own
(generation, epoch) watermark, so epoch 2 never raises epoch 1's numbers.

A batch is applied in waves: wave k holds the k-th event of each generation in the batch, in log order.
Generations never read each other's rows (the hourly totals are sums), so within a wave the events of
one kind go as one pipelined `executemany` or one set-based statement, and a wave of terminal events
waits for three answers, not three per generation. The rows are those of applying event by event.
A `PeriodClosed` marker cuts the batch: what precedes it is applied before it (statements.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import psycopg

from projections.endings import FINISHED, TERMINAL_STATUS, on_terminal
from projections.statements import on_period_closed
from projections.usage import record_reports
from schemas.billing_periods import PeriodClosed
from schemas.envelope import Envelope
from schemas.lifecycle import Admitted, AttemptStarted, CancelRequested, UsageReported
from schemas.topics import GENERATIONS


class LifecycleProjection:
    name = "generations"
    topic = GENERATIONS

    def tables(self) -> tuple[str, ...]:
        return ("generations", "attempts", "usage_watermarks", "usage_reports", "billing_ledger",
                "usage_reconciliation", "tenant_usage_hourly", "statement_items", "billing_period_marks",
                "billing_periods", "statements", "statement_totals")

    def apply(self, conn: psycopg.Connection, events: Sequence[Envelope]) -> None:
        with conn.pipeline():
            for segment, marker in at_period_marks(events):
                for wave in waves(segment):
                    for handler, kind in group_by_handler(wave).items():
                        handler(conn, kind)
                if marker is not None:
                    on_period_closed(conn, marker)


def at_period_marks(events: Sequence[Envelope]) -> list[tuple[list[Envelope], PeriodClosed | None]]:
    """The batch cut after each period marker: the seals before a marker are applied before it, those after
    it after it (a marker closes its period for the seals of its own partition that follow it)."""
    cuts: list[tuple[list[Envelope], PeriodClosed | None]] = []
    segment: list[Envelope] = []
    for event in events:
        if isinstance(event, PeriodClosed):
            cuts.append((segment, event))
            segment = []
        else:
            segment.append(event)
    return cuts + [(segment, None)]


def waves(events: Sequence[Envelope]) -> list[list[Envelope]]:
    """Wave k: the k-th projected event of each generation, in log order (at most one per generation)."""
    seen: dict[str, int] = {}
    out: list[list[Envelope]] = []
    for event in events:
        if type(event) not in HANDLERS:
            continue
        k = seen.get(event.generation_id, 0)
        seen[event.generation_id] = k + 1
        if k == len(out):
            out.append([])
        out[k].append(event)
    return out


def group_by_handler(wave: list[Envelope]) -> dict[Callable, list[Envelope]]:
    groups: dict[Callable, list[Envelope]] = {}
    for event in wave:
        groups.setdefault(HANDLERS[type(event)], []).append(event)
    return groups


def on_admitted(conn: psycopg.Connection, events: list[Admitted]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            """
            INSERT INTO generations (generation_id, tenant_id, request_id, model_version, status, tier,
                                     current_epoch, input_tokens, max_output_tokens, reserved_tokens, payload_hash,
                                     admitted_at, updated_at)
            VALUES (%s, %s, %s, %s, 'admitted', %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (generation_id) DO NOTHING
            """,
            [(e.generation_id, e.tenant_id, e.request_id, e.model_version, e.tier, e.epoch, e.input_tokens,
              e.max_output_tokens, e.reserved_tokens, e.payload_hash, e.occurred_at, e.occurred_at) for e in events])


def on_attempt_started(conn: psycopg.Connection, events: list[AttemptStarted]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO attempts (generation_id, epoch, worker_id, started_at) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING", [(e.generation_id, e.epoch, e.worker_id, e.occurred_at) for e in events])
        cur.executemany(
            f"""
            UPDATE generations SET status = 'running', current_epoch = %s, worker_id = %s,
                   started_at = COALESCE(started_at, %s), updated_at = %s
            WHERE generation_id = %s AND status NOT IN {FINISHED}
              AND (current_epoch IS NULL OR current_epoch <= %s)
            """,
            [(e.epoch, e.worker_id, e.occurred_at, e.occurred_at, e.generation_id, e.epoch) for e in events])


def on_cancel_requested(conn: psycopg.Connection, events: list[CancelRequested]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            f"UPDATE generations SET cancel_requested = true, updated_at = %s "
            f"WHERE generation_id = %s AND status NOT IN {FINISHED} AND NOT cancel_requested",
            [(e.occurred_at, e.generation_id) for e in events])


def on_usage_reported(conn: psycopg.Connection, events: list[UsageReported]) -> None:
    record_reports(conn, events)
    refresh_summaries(conn, [e.generation_id for e in events])


def refresh_summaries(conn: psycopg.Connection, generation_ids: list[str]) -> None:
    """The status row shows the current attempt's watermark (never another epoch's)."""
    conn.execute(
        f"""
        UPDATE generations g SET processed_input_tokens = w.processed_input_tokens,
               cached_input_tokens = w.cached_input_tokens, generated_output_tokens = w.generated_output_tokens
        FROM usage_watermarks w
        WHERE g.generation_id = ANY(%s) AND w.generation_id = g.generation_id AND w.epoch = g.current_epoch
          AND g.status NOT IN {FINISHED}
        """, (generation_ids,))


HANDLERS: dict[type, Callable[[psycopg.Connection, list], None]] = {
    Admitted: on_admitted,
    AttemptStarted: on_attempt_started,
    CancelRequested: on_cancel_requested,
    UsageReported: on_usage_reported,
    **{kind: on_terminal for kind in TERMINAL_STATUS},
}
