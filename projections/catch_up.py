"""Apply one topic to one projection up to the topic's current end, offsets in Postgres.

This is the bounded, single-process form of the projector: read the stored
offsets, fetch every partition up to the end offsets captured at the start,
and apply each record in the same transaction as its offset update. Records
that do not decode go to the DLQ (through `router`) and only advance the offset.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg
from aiokafka import AIOKafkaConsumer

from consumers.kafka.clients import partitions_of
from consumers.kafka.dead_letters import DeadLetterRouter
from projections.offsets import advance, load_offsets
from schemas.envelope import Envelope

log = logging.getLogger(__name__)

Apply = Callable[[psycopg.Connection, Envelope], None]


async def catch_up(consumer: AIOKafkaConsumer, conn: psycopg.Connection, router: DeadLetterRouter,
                   projection: str, topic: str, apply: Apply, timeout_ms: int = 1000) -> int:
    """Project everything up to the end offsets seen now; returns the number of records applied."""
    partitions = await partitions_of(consumer, topic)
    if not partitions:
        raise LookupError(f"topic {topic} has no partitions (run `ledgerlm topics ensure`)")
    consumer.assign(partitions)
    stored = load_offsets(conn, projection, topic)
    for tp in partitions:
        if tp.partition in stored:
            consumer.seek(tp, stored[tp.partition])
        else:
            await consumer.seek_to_beginning(tp)
    ends = await consumer.end_offsets(partitions)
    applied = 0
    pending = {tp for tp in partitions if await consumer.position(tp) < ends[tp]}
    while pending:
        batches = await consumer.getmany(*pending, timeout_ms=timeout_ms)
        for tp, records in batches.items():
            for record in records:
                event = await router.decode_or_divert(record)
                with conn.transaction():
                    if event is not None:
                        apply(conn, event)
                        applied += 1
                    advance(conn, projection, topic, tp.partition, stored.get(tp.partition), record.offset + 1)
                stored[tp.partition] = record.offset + 1
        # Positions, not stored offsets: transaction markers and compaction leave gaps in offsets.
        pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
    log.info("projection=%s topic=%s caught up applied=%d", projection, topic, applied)
    return applied
