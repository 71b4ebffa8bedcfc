"""The gateway's reads from Postgres: API key hash -> tenant, generation status rows, the resume buffer.

Reads share a small pool of connections (`gateway_db_pool_size`), so one slow
read (a flood of unknown keys, a large resume buffer) never queues every other
tenant's reads behind it on one connection. Caching of key lookups is
`producers.gateway.auth.authenticator`'s business.

A database that does not answer (unreachable, dropped, recreated but not
migrated yet: the chaos run's projection rebuild) is `DatabaseUnavailable`, a
503 with Retry-After on every route, never a 500.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
import psycopg_pool
from psycopg_pool import AsyncConnectionPool

from producers.gateway.errors import DatabaseUnavailable
from projections.stream_text import decode_text
from schemas.stream import TokenLogprob

log = logging.getLogger(__name__)

APPLICATION_NAME = "ledgerlm-gateway"
# What a read meets while the database is down or being rebuilt: a cut or refused connection (OperationalError),
# no connection within the pool's timeout (PoolTimeout, an OperationalError too), a database created again whose
# tables the migrations have not made yet (UndefinedTable).
UNAVAILABLE = (psycopg.OperationalError, psycopg.errors.UndefinedTable)


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    max_tokens_in_flight: int
    tokens_per_minute: int

    @property
    def max_tokens_per_request(self) -> int:
        """A request larger than this could never be admitted: it is invalid (400), not throttled (429)."""
        return min(self.max_tokens_in_flight, self.tokens_per_minute)


@dataclass(frozen=True)
class BufferedEvent:
    """A token event as the resume buffer keeps it (`token_count`: the count so far; 0 where not read)."""

    seq: int
    token_ids: list[int]
    text: str
    token_count: int
    choice: int
    choice_end: str | None
    stored_logprobs: dict | None

    def logprobs(self, key: str = "logprobs") -> tuple[TokenLogprob, ...] | None:
        entries = (self.stored_logprobs or {}).get(key)
        if entries is None:
            return None
        return tuple(TokenLogprob.model_validate(e, strict=False) for e in entries)


@dataclass(frozen=True)
class StreamProgress:
    epoch: int
    last_seq: int
    oldest_seq: int  # the first seq still retained (last_seq + 1 once an ended buffer is dropped)
    token_count: int
    end_reason: str | None


def buffered(row: tuple) -> BufferedEvent:
    """A resume-buffer row (seq, token ids, text bytes, count, choice, choice end, logprobs) as an event."""
    seq, token_ids, text, *rest = row
    return BufferedEvent(seq, token_ids, decode_text(text), *rest)


STATUS_COLUMNS = ("generation_id", "tenant_id", "request_id", "model_version", "status", "tier", "current_epoch",
                  "worker_id", "cancel_requested", "end_reason", "input_tokens", "max_output_tokens",
                  "processed_input_tokens", "cached_input_tokens", "generated_output_tokens", "admitted_at",
                  "ended_at")


class GatewayDatabase:
    """A pool of at most `pool_size` autocommit connections; each query borrows one for its duration, waiting at
    most `timeout_s` for it."""

    def __init__(self, url: str, pool_size: int = 4, timeout_s: float = 10.0, retry_after_ms: int = 1000) -> None:
        self.url = url
        self.retry_after_ms = retry_after_ms
        self.pool = AsyncConnectionPool(url, min_size=1, max_size=pool_size, open=False, timeout=timeout_s,
                                        kwargs={"autocommit": True, "application_name": APPLICATION_NAME},
                                        name="gateway-reads")

    async def start(self) -> None:
        await self.pool.open(wait=True, timeout=self.pool.timeout)

    async def stop(self) -> None:
        await self.pool.close()

    async def ping(self) -> bool:
        """The database answers `SELECT 1` (reconnecting once); False on any database error."""
        try:
            return await self._fetchone("SELECT 1", ()) is not None
        except (psycopg.Error, DatabaseUnavailable):
            return False

    async def _rows(self, sql: str, params: tuple) -> list[tuple]:
        """Every query goes through here; DatabaseUnavailable when the database does not answer."""
        try:
            return await self._reconnecting(sql, params)
        except UNAVAILABLE as exc:
            log.warning("database unavailable error=%s", type(exc).__name__)
            raise DatabaseUnavailable(type(exc).__name__, self.retry_after_ms) from exc

    async def _reconnecting(self, sql: str, params: tuple) -> list[tuple]:
        """A connection lost to a Postgres restart (or a dropped database) is discarded by the pool when it comes
        back broken; the query then has the pool check its idle connections (dropping the dead ones) and runs
        once more, so the gateway recovers when the database is back instead of failing requests on dead
        connections."""
        try:
            return await self._run(sql, params)
        except psycopg_pool.PoolTimeout:
            raise
        except psycopg.OperationalError:
            await self.pool.check()
            return await self._run(sql, params)

    async def _run(self, sql: str, params: tuple) -> list[tuple]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchall()

    async def _fetchone(self, sql: str, params: tuple):
        rows = await self._rows(sql, params)
        return rows[0] if rows else None

    async def principal_of_key(self, key_hash: str) -> Principal | None:
        """The tenant whose live API key has this hash (no cache)."""
        rows = await self._rows(
            "SELECT t.tenant_id, t.max_tokens_in_flight, t.tokens_per_minute FROM api_keys k "
            "JOIN tenants t USING (tenant_id) WHERE k.key_hash = %s AND k.revoked_at IS NULL LIMIT 2", (key_hash,))
        # A hash two tenants claim is ambiguous: it authenticates nobody (as producers.api_keys.authenticate).
        return Principal(rows[0][0], int(rows[0][1]), int(rows[0][2])) if len(rows) == 1 else None

    async def fetch(self, sql: str, params: tuple | dict) -> list[tuple]:
        """A read of the projections for the modules that own its SQL (native/usage.py): same pool and errors."""
        return await self._rows(sql, params)

    async def generation(self, generation_id: str) -> dict | None:
        row = await self._fetchone(f"SELECT {', '.join(STATUS_COLUMNS)} FROM generations WHERE generation_id = %s",
                                   (generation_id,))
        return dict(zip(STATUS_COLUMNS, row)) if row else None

    async def projected_offsets(self, topics: list[str]) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the next offset every projection of it still has to apply (none: nothing yet)."""
        from projections.queries import PROJECTED_OFFSETS_SQL

        return {(topic, partition): offset
                for topic, partition, offset in await self._rows(PROJECTED_OFFSETS_SQL, (topics,))}

    async def knows_request(self, tenant_id: str, request_id: str) -> bool:
        """The tenant already has a generation under this request id (as far as the projection has seen)."""
        return await self._fetchone("SELECT 1 FROM generations WHERE tenant_id = %s AND request_id = %s LIMIT 1",
                                    (tenant_id, request_id)) is not None

    async def stream_events(self, generation_id: str, epoch: int, after_seq: int = 0) -> list[BufferedEvent]:
        """The resume buffer (projection of `llm.tokens`): the token events of one epoch after a seq, in order."""
        rows = await self._rows(
            "SELECT seq, token_ids, text_delta, 0, choice, choice_end, logprobs FROM stream_events "
            "WHERE generation_id = %s AND epoch = %s AND NOT is_final AND seq > %s ORDER BY seq",
            (generation_id, epoch, after_seq))
        return [buffered(row) for row in rows]

    async def stream_rows(self, generation_id: str, epoch: int, after_seq: int) -> list[BufferedEvent]:
        """The resume buffer after a seq, with the token count so far of each event, read in one snapshot."""
        rows = await self._rows(
            "SELECT e.seq, e.token_ids, e.text_delta, p.token_count - COALESCE(sum(cardinality(e.token_ids)) "
            "OVER (ORDER BY e.seq DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0), e.choice, "
            "e.choice_end, e.logprobs "
            "FROM stream_events e JOIN stream_progress p ON p.generation_id = e.generation_id "
            "AND p.epoch = e.epoch WHERE e.generation_id = %s AND e.epoch = %s AND e.seq > %s "
            "AND NOT e.is_final ORDER BY e.seq", (generation_id, epoch, after_seq))
        return [buffered(row) for row in rows]

    async def stream_progress(self, generation_id: str) -> StreamProgress | None:
        """What the resume buffer holds of a generation's newest epoch (None: nothing projected yet)."""
        row = await self._fetchone("SELECT epoch, last_seq, oldest_seq, token_count, end_reason FROM stream_progress "
                                   "WHERE generation_id = %s", (generation_id,))
        return StreamProgress(*row) if row else None
