"""Terminal lifecycle events of one wave (distinct generations): close the attempt, fix the status, seal.

Per generation, the same decisions as event by event: the first terminal event wins; a terminal event of
an older epoch only closes that attempt's row; the worker's terminal usage is merged into its watermark
before the status row and the bill take that watermark. For the wave: one read of the generation rows, one
of the watermarks and one answer from the bills' INSERT; everything else is pipelined.
"""
from __future__ import annotations

from dataclasses import dataclass

import psycopg

from projections.billing import SealInput, seal_all
from projections.usage import Raise, raise_watermarks, watermarks
from schemas.envelope import Envelope
from schemas.lifecycle import Canceled, Completed, Expired, Failed, Interrupted, Rejected

TERMINAL_STATUS = {Completed: "completed", Canceled: "canceled", Interrupted: "interrupted",
                   Expired: "expired", Failed: "failed", Rejected: "rejected"}
FINISHED = tuple(TERMINAL_STATUS.values())


@dataclass(frozen=True)
class Ending:
    """A terminal event that ends its generation (not a stale attempt's, not after another ending)."""

    event: Envelope
    epoch: int | None
    end_reason: str
    model_version: str
    reserved_tokens: int


def on_terminal(conn: psycopg.Connection, events: list[Envelope]) -> None:
    """Apply terminal events of distinct generations."""
    rows = {r[0]: r[1:] for r in conn.execute(
        "SELECT generation_id, status, current_epoch, model_version, reserved_tokens FROM generations "
        "WHERE generation_id = ANY(%s) ORDER BY generation_id FOR UPDATE",
        ([e.generation_id for e in events],)).fetchall()}
    closed: list[tuple] = []
    endings: list[Ending] = []
    for e in events:
        row = rows.get(e.generation_id)
        epoch = e.epoch if e.epoch is not None else (row[1] if row else None)
        end_reason = end_reason_of(e)
        if epoch is not None:
            closed.append((e.occurred_at, end_reason, e.generation_id, epoch))
        if row is None or row[0] in FINISHED:
            continue  # never admitted here, or already ended: the first terminal event wins
        if e.epoch is not None and row[1] is not None and e.epoch < row[1]:
            continue  # a stale attempt ended; the current one goes on
        endings.append(Ending(e, epoch, end_reason, row[2], row[3]))
    with conn.cursor() as cur:
        cur.executemany("UPDATE attempts SET ended_at = %s, end_reason = %s "
                        "WHERE generation_id = %s AND epoch = %s AND ended_at IS NULL", closed)
    if endings:
        end(conn, endings)


def end(conn: psycopg.Connection, endings: list[Ending]) -> None:
    # The worker's terminal usage is its final watermark, durable in the same log.
    raise_watermarks(conn, [Raise(x.event.tenant_id, x.event.generation_id, x.epoch, x.event.usage,
                                  x.event.occurred_at)
                            for x in endings if getattr(x.event, "usage", None) is not None and x.epoch is not None])
    final = watermarks(conn, [(x.event.generation_id, x.epoch) for x in endings])
    with conn.cursor() as cur:
        cur.executemany(
            """
            UPDATE generations SET status = %s, end_reason = %s, ended_at = %s, updated_at = %s,
                   current_epoch = %s, processed_input_tokens = %s, cached_input_tokens = %s,
                   generated_output_tokens = %s
            WHERE generation_id = %s
            """,
            [(TERMINAL_STATUS[type(x.event)], x.end_reason, x.event.occurred_at, x.event.occurred_at, x.epoch,
              usage.processed_input_tokens, usage.cached_input_tokens, usage.generated_output_tokens,
              x.event.generation_id)
             for x in endings for usage in (final[(x.event.generation_id, x.epoch)],)])
    seal_all(conn, [SealInput(
        generation_id=x.event.generation_id, tenant_id=x.event.tenant_id, epoch=x.epoch,
        model_version=x.model_version, reserved_tokens=x.reserved_tokens, end_reason=x.end_reason,
        usage_label="interrupted" if isinstance(x.event, Interrupted) else "final", sealed_at=x.event.occurred_at,
        usage=final[(x.event.generation_id, x.epoch)]) for x in endings])


def end_reason_of(e: Envelope) -> str:
    """The client-facing end reason (docs/streams.md): completed, output-limit, canceled, interrupted, ..."""
    if isinstance(e, Completed):
        return "output-limit" if e.finish_reason == "length" else "completed"
    return TERMINAL_STATUS[type(e)]
