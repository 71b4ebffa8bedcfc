"""The gateway's reads from Postgres: API keys -> tenant (cached briefly) and generation status rows."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import psycopg

from producers.api_keys import could_be_key, hash_api_key
from schemas.stream import TokenLogprob

AUTH_CACHE_S = 5.0


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


STATUS_COLUMNS = ("generation_id", "tenant_id", "request_id", "model_version", "status", "tier", "current_epoch",
                  "worker_id", "cancel_requested", "end_reason", "input_tokens", "max_output_tokens",
                  "processed_input_tokens", "cached_input_tokens", "generated_output_tokens", "admitted_at",
                  "ended_at")


class GatewayDatabase:
    """One connection, used by one coroutine at a time; auth answers are cached for a few seconds."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: psycopg.AsyncConnection | None = None
        self.lock = asyncio.Lock()
        self._auth: dict[str, tuple[float, Principal | None]] = {}

    async def start(self) -> None:
        self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)

    async def stop(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    async def ping(self) -> bool:
        """The database answers `SELECT 1` (reconnecting once); False on any database error."""
        try:
            return await self._fetchone("SELECT 1", ()) is not None
        except psycopg.Error:
            return False

    async def _rows(self, sql: str, params: tuple) -> list[tuple]:
        """Every query goes through here: a connection lost to a Postgres restart (or a dropped database) is
        replaced, once per query, and a closed one is replaced before the next query, so the gateway
        recovers when the database is back instead of failing every request on the dead connection."""
        async with self.lock:
            if self.conn is None or self.conn.closed:
                await self.start()
            try:
                cur = await self.conn.execute(sql, params)
            except psycopg.OperationalError:
                await self.start()
                cur = await self.conn.execute(sql, params)
            return await cur.fetchall()

    async def _fetchone(self, sql: str, params: tuple):
        rows = await self._rows(sql, params)
        return rows[0] if rows else None

    async def authenticate(self, presented: str | None) -> Principal | None:
        if not could_be_key(presented):
            return None
        key_hash = hash_api_key(presented)
        cached = self._auth.get(key_hash)
        if cached is not None and time.monotonic() - cached[0] < AUTH_CACHE_S:
            return cached[1]
        rows = await self._rows(
            "SELECT t.tenant_id, t.max_tokens_in_flight, t.tokens_per_minute FROM api_keys k "
            "JOIN tenants t USING (tenant_id) WHERE k.key_hash = %s AND k.revoked_at IS NULL LIMIT 2", (key_hash,))
        # A hash two tenants claim is ambiguous: it authenticates nobody (as producers.api_keys.authenticate).
        principal = Principal(rows[0][0], int(rows[0][1]), int(rows[0][2])) if len(rows) == 1 else None
        self._auth[key_hash] = (time.monotonic(), principal)
        return principal

    async def tenant_usage(self, tenant_id: str, start, end):
        from projections.queries import TENANT_USAGE_SQL, summarize

        rows = await self._rows(TENANT_USAGE_SQL, (tenant_id, start, end))
        return summarize(tenant_id, start, end, rows)

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
        return [BufferedEvent(*row) for row in rows]

    async def stream_rows(self, generation_id: str, epoch: int, after_seq: int) -> list[BufferedEvent]:
        """The resume buffer after a seq, with the token count so far of each event, read in one snapshot."""
        rows = await self._rows(
            "SELECT e.seq, e.token_ids, e.text_delta, p.token_count - COALESCE(sum(cardinality(e.token_ids)) "
            "OVER (ORDER BY e.seq DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0), e.choice, "
            "e.choice_end, e.logprobs "
            "FROM stream_events e JOIN stream_progress p ON p.generation_id = e.generation_id "
            "AND p.epoch = e.epoch WHERE e.generation_id = %s AND e.epoch = %s AND e.seq > %s "
            "AND NOT e.is_final ORDER BY e.seq", (generation_id, epoch, after_seq))
        return [BufferedEvent(*row) for row in rows]

    async def stream_progress(self, generation_id: str) -> StreamProgress | None:
        """What the resume buffer holds of a generation's newest epoch (None: nothing projected yet)."""
        row = await self._fetchone("SELECT epoch, last_seq, oldest_seq, token_count, end_reason FROM stream_progress "
                                   "WHERE generation_id = %s", (generation_id,))
        return StreamProgress(*row) if row else None
