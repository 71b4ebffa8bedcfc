"""Health probes: the Kafka admin client lists topics; PostgreSQL answers SELECT 1."""
from __future__ import annotations

import asyncio

import psycopg

from plumbing.kafka.clients import Kafka, make_admin


async def kafka_topics(kafka: Kafka, timeout_s: float = 5.0) -> list[str] | None:
    """The broker's topic names, or None when it cannot be reached in time."""
    admin = make_admin(kafka, request_timeout_ms=int(timeout_s * 1000), client_id="ledgerlm-health")
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        return sorted(await asyncio.wait_for(admin.list_topics(), timeout_s))
    except Exception:  # noqa: BLE001 - any failure means "not healthy"
        return None
    finally:
        try:
            await admin.close()
        except Exception:  # noqa: BLE001
            pass


def kafka_up(kafka: Kafka, timeout_s: float = 5.0) -> bool:
    return asyncio.run(kafka_topics(kafka, timeout_s)) is not None


def postgres_up(url: str, timeout_s: float = 3.0) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=max(1, int(timeout_s))) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.Error:
        return False
