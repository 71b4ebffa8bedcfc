"""Events the read model refuses: found by bisection, stored in the transaction that skips them.

A batch the database refuses is split in halves, each half applied in a savepoint, down to the single
events that fail alone; the good events around them are applied in runs, as many statements as the
batch would have taken times about 2·log2(batch) per refused event, never one statement per row.
Halves go left to right, so every event is applied after all the accepted events before it: the result
(and which events are refused) is the same as applying event by event, whatever the batch boundaries.

The dead letter on `llm.dlq` is published only after that transaction commits and may fail; the
`refused_events` row may not, so a refused event (a seal among them) is never known from a log line alone.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg
from aiokafka import TopicPartition

from projections.base import Projection
from schemas.envelope import Envelope

log = logging.getLogger(__name__)

REFUSALS = (psycopg.errors.IntegrityError, psycopg.errors.DataError)


def refusal_reason(exc: psycopg.Error) -> str:
    """Error class, the server's first message line (names a constraint or a type, never a value) and SQLSTATE."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0]} [SQLSTATE {exc.sqlstate}]"


def apply_refusing(conn: psycopg.Connection, projection: Projection,
                   events: Sequence[Envelope]) -> list[tuple[Envelope, str]]:
    """Apply `events` in the current transaction; the events the database refused, with the reason."""
    try:
        with conn.transaction():
            projection.apply(conn, events)
        return []
    except REFUSALS as exc:
        if len(events) == 1:
            event = events[0]
            log.error("projection refused event projection=%s type=%s event_id=%s generation=%s error=%s "
                      "sqlstate=%s", projection.name, event.type, event.event_id,
                      getattr(event, "generation_id", None), type(exc).__name__, exc.sqlstate)
            return [(event, refusal_reason(exc))]
    middle = len(events) // 2
    return apply_refusing(conn, projection, events[:middle]) + apply_refusing(conn, projection, events[middle:])


def store_refused(conn: psycopg.Connection, projection: str, tp: TopicPartition,
                  refused: list[tuple[int, Envelope, str]]) -> None:
    """(offset, event, reason) of each refused event of one partition's batch; the event as its JSON text."""
    if not refused:
        return
    with conn.cursor() as cur:
        cur.executemany(
            'INSERT INTO refused_events (projection, topic, partition, "offset", event_id, event_type, reason, event) '
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [(projection, tp.topic, tp.partition, offset, event.event_id, event.type, reason, event.model_dump_json())
             for offset, event, reason in refused])
