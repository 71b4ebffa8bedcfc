"""Closing a billing period is an event: a `PeriodClosed` marker into every partition of `llm.generations`.

    check: a calendar month that has ended (by this clock) and is not closed yet
    write: one marker per partition, the same close id and time (acks=all, idempotent producer)
    wait:  until the projector has seen every marker and made the statements (`billing_periods`)

Markers are not one transaction: each partition's marker stands alone (schemas/billing_periods.py), so a
close that stops half way has closed the period in the partitions it reached, and running it again
writes the rest (the first marker of a partition wins).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

import psycopg

from plumbing.kafka.clients import Kafka, make_producer, publish
from projections.periods import Period, PeriodError
from schemas.billing_periods import PeriodClosed
from schemas.envelope import utc_now
from schemas.topics import GENERATIONS

log = logging.getLogger(__name__)


class PeriodNotClosable(ValueError):
    """The period cannot be closed now; the message says why."""


@dataclass(frozen=True)
class ClosedPeriod:
    """A closed period as `billing_periods` holds it."""

    period: str
    closed_at: datetime
    partitions: int
    tenants: int
    generations: int


def closable(text: str, now: datetime) -> Period:
    """The period named by `text`, if it may be closed at `now`: a well-formed month that has ended."""
    try:
        period = Period.parse(text)
    except PeriodError as exc:
        raise PeriodNotClosable(str(exc)) from None
    if not period.has_ended(now):
        raise PeriodNotClosable(f"period {period} has not ended: it can be closed from {period.end.isoformat()}")
    return period


def closed_period(database_url: str, period: str) -> ClosedPeriod | None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT period, closed_at, partitions, tenants, generations FROM billing_periods "
                           "WHERE period = %s", (period,)).fetchone()
    return ClosedPeriod(*row) if row else None


async def write_markers(kafka: Kafka, period: Period) -> int:
    """One marker per partition of `llm.generations`; the number of partitions written."""
    producer = make_producer(kafka, client_id="ledgerlm-billing-close")
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(GENERATIONS))
        close_id, now = uuid.uuid4(), utc_now()
        await asyncio.gather(*[publish(producer, GENERATIONS, PeriodClosed(
            period=str(period), partition=p, partitions=len(partitions), close_id=close_id, occurred_at=now),
            partition=p) for p in partitions])
    finally:
        await producer.stop()
    log.info("period markers written period=%s close_id=%s partitions=%d", period, close_id, len(partitions))
    return len(partitions)


async def wait_closed(database_url: str, period: str, timeout_s: float, poll_s: float = 0.25) -> ClosedPeriod | None:
    """The closed period once the projector made its statements; None if not within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await asyncio.to_thread(closed_period, database_url, period)
        if found is not None or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(poll_s)


async def close_period(kafka: Kafka, database_url: str, text: str, wait_s: float,
                       now: datetime | None = None) -> tuple[ClosedPeriod | None, bool]:
    """Close `text` (e.g. "2026-11"): (the closed period or None while not projected yet, whether it was
    already closed before this call)."""
    period = closable(text, now or utc_now())
    found = await asyncio.to_thread(closed_period, database_url, str(period))
    if found is not None:
        return found, True
    await write_markers(kafka, period)
    return await wait_closed(database_url, str(period), wait_s), False
