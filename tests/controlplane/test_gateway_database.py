"""The gateway's one Postgres connection survives the server dropping it (a restart, a dropped database)."""
from __future__ import annotations

import psycopg
import pytest

from producers.gateway.database import GatewayDatabase


async def test_every_query_reconnects_after_the_server_dropped_the_connection(database_url, conn):
    db = GatewayDatabase(database_url)
    await db.start()
    try:
        assert await db.authenticate("llm_" + "0" * 40) is None  # any well-formed unknown key: a real query
        for query in (lambda: db.authenticate("llm_" + "1" * 40), lambda: db.generation("gen_missing"),
                      lambda: db.stream_events("gen_missing", 1), lambda: db.stream_rows("gen_missing", 1, 0)):
            pid = (await (await db.conn.execute("SELECT pg_backend_pid()")).fetchone())[0]
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            assert not await query()
    finally:
        await db.stop()


async def test_a_failed_reconnect_is_retried_by_the_next_query(database_url):
    db = GatewayDatabase(database_url)
    await db.start()
    try:
        await db.conn.close()
        db.url = database_url.rsplit("/", 1)[0] + "/no_such_database"
        with pytest.raises(psycopg.OperationalError):
            await db.generation("gen_missing")
        db.url = database_url
        assert await db.generation("gen_missing") is None
    finally:
        await db.stop()
