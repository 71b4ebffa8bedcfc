"""The gateway's Postgres pool: it survives the server dropping its connections (a restart, a dropped database),
and one blocked read does not stall the others (issue 15, finding 4)."""
from __future__ import annotations

import asyncio

import psycopg

from producers.gateway.database import APPLICATION_NAME, GatewayDatabase
from tests.waiting import wait_until


async def backend_pids(db: GatewayDatabase) -> list[int]:
    async with db.pool.connection() as conn:
        return [(await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]]


async def test_every_query_reconnects_after_the_server_dropped_the_connection(database_url, conn):
    db = GatewayDatabase(database_url, pool_size=1)
    await db.start()
    try:
        assert await db.principal_of_key("0" * 64) is None  # any unknown key hash: a real query
        for query in (lambda: db.principal_of_key("1" * 64), lambda: db.generation("gen_missing"),
                      lambda: db.stream_events("gen_missing", 1), lambda: db.stream_rows("gen_missing", 1, 0)):
            (pid,) = await backend_pids(db)
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            assert not await query()
    finally:
        await db.stop()


async def test_a_read_blocked_on_a_lock_does_not_stall_other_reads(database_url, conn):
    """Before the pool, every read waited for the one shared connection: a slow read stalled every tenant."""
    db = GatewayDatabase(database_url, pool_size=2)
    await db.start()
    blocker = await psycopg.AsyncConnection.connect(database_url)
    try:
        await blocker.execute("LOCK TABLE generations IN ACCESS EXCLUSIVE MODE")  # held until rollback
        blocked = asyncio.create_task(db.generation("gen_blocked"))
        await wait_until(lambda: conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
            (APPLICATION_NAME,)).fetchone(), 10, what="the read to wait on the lock")
        assert await asyncio.wait_for(db.principal_of_key("2" * 64), 10) is None
        assert not blocked.done()
        await blocker.rollback()
        assert await asyncio.wait_for(blocked, 10) is None
    finally:
        await blocker.close()
        await db.stop()
