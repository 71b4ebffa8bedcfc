"""Events a projection refused, stored in the transaction that skips them (`refused_events`).

The dead letter on `llm.dlq` is published only after that transaction
commits and may fail; this row may not, so a refused event (a seal among
them) is never known from a log line alone.
"""
from __future__ import annotations

import psycopg
from aiokafka import TopicPartition

from schemas.envelope import Envelope


def store_refused(conn: psycopg.Connection, projection: str, tp: TopicPartition,
                  refused: list[tuple[int, Envelope, str]]) -> None:
    """(offset, event, reason) of each refused event of one partition's batch."""
    if not refused:
        return
    with conn.cursor() as cur:
        cur.executemany(
            'INSERT INTO refused_events (projection, topic, partition, "offset", event_id, event_type, reason, event) '
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb)",
            [(projection, tp.topic, tp.partition, offset, event.event_id, event.type, reason, event.model_dump_json())
             for offset, event, reason in refused])

