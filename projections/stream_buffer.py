"""The resume buffer: llm.tokens -> stream_events + stream_progress.

Per generation only the newest epoch is kept: an event of an older epoch is
dropped, and the first event of a newer epoch clears the older one. The
buffer keeps the last `keep_events` events of a stream, and an ended stream
for `keep_after_end` of *log* time (the newest event time projected), never
wall time, so a replay of the same log trims the same rows.

Batches are pre-aggregated per generation in Python, then written with one
COPY into a staging table and a handful of set-based statements, so a
multi-row upsert never touches one row twice.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg
from psycopg.types.json import Jsonb

from projections.billing import lock_generations, refresh_unbilled_tail
from projections.stream_text import encode_text
from schemas.envelope import Envelope
from schemas.stream import StreamFinished, TokensEmitted
from schemas.topics import TOKENS

STAGE_DDL = ("CREATE TEMP TABLE IF NOT EXISTS stream_events_stage "
             "(LIKE stream_events INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")


def logprobs_json(event: TokensEmitted) -> Jsonb | None:
    """The event's logprobs as stored (None when it carries none, as most do)."""
    if event.logprobs is None and event.prompt_logprobs is None:
        return None
    return Jsonb(event.model_dump(mode="json", include={"logprobs", "prompt_logprobs"}))


@dataclass
class Progress:
    tenant_id: str
    epoch: int
    last_seq: int = 0
    oldest_seq: int = 1
    token_count: int = 0
    end_reason: str | None = None
    ended_at: datetime | None = None
    updated_at: datetime | None = None
    new_epoch: bool = False
    rows: list[tuple] = field(default_factory=list)


class StreamBufferProjection:
    name = "stream"
    topic = TOKENS

    def __init__(self, keep_events: int = 4096, keep_after_end: timedelta = timedelta(hours=1),
                 trim_batch: int = 500) -> None:
        self.keep_events = keep_events
        self.keep_after_end = keep_after_end
        self.trim_batch = trim_batch

    def tables(self) -> tuple[str, ...]:
        return ("stream_events", "stream_progress")

    def apply(self, conn: psycopg.Connection, events: Sequence[Envelope]) -> None:
        stream = [e for e in events if isinstance(e, (TokensEmitted, StreamFinished))]
        if not stream:
            return
        progress = self._load(conn, {e.generation_id for e in stream})
        for event in stream:
            self._fold(progress, event)
        self._write(conn, progress)
        self.trim_ended(conn, self.trim_batch)

    def _load(self, conn: psycopg.Connection, generation_ids: set[str]) -> dict[str, Progress]:
        rows = conn.execute(
            "SELECT generation_id, tenant_id, epoch, last_seq, oldest_seq, token_count, end_reason, ended_at, "
            "updated_at FROM stream_progress WHERE generation_id = ANY(%s)", (list(generation_ids),)).fetchall()
        return {r[0]: Progress(*r[1:]) for r in rows}

    def _fold(self, progress: dict[str, Progress], e: TokensEmitted | StreamFinished) -> None:
        p = progress.get(e.generation_id)
        if p is None or e.epoch > p.epoch:
            p = progress[e.generation_id] = Progress(tenant_id=e.tenant_id, epoch=e.epoch, new_epoch=True)
        elif e.epoch < p.epoch:
            return  # a stale attempt's event: never part of the stream
        if isinstance(e, TokensEmitted):
            p.rows.append((e.generation_id, e.epoch, e.seq, list(e.token_ids), encode_text(e.text_delta), False,
                           None, None, e.occurred_at, e.choice, e.choice_end, logprobs_json(e)))
            p.token_count = max(p.token_count, e.token_count)
        else:
            p.rows.append((e.generation_id, e.epoch, e.seq, [], b"", True, e.reason,
                           Jsonb(e.usage.model_dump()), e.occurred_at, 0, None, None))
            p.end_reason, p.ended_at = e.reason, e.occurred_at
        p.last_seq = max(p.last_seq, e.seq)
        p.updated_at = max(p.updated_at, e.occurred_at) if p.updated_at else e.occurred_at
        p.oldest_seq = max(p.oldest_seq, p.last_seq - self.keep_events + 1)

    def _write(self, conn: psycopg.Connection, progress: dict[str, Progress]) -> None:
        fresh = [gid for gid, p in progress.items() if p.new_epoch]
        if fresh:
            conn.execute("DELETE FROM stream_events WHERE generation_id = ANY(%s)", (fresh,))
        conn.execute(STAGE_DDL)
        with conn.cursor().copy("COPY stream_events_stage (generation_id, epoch, seq, token_ids, text_delta, "
                                "is_final, end_reason, usage, occurred_at, choice, choice_end, logprobs) "
                                "FROM STDIN") as copy:
            for p in progress.values():
                for row in p.rows:
                    if row[2] >= p.oldest_seq:
                        copy.write_row(row)
        conn.execute("INSERT INTO stream_events SELECT * FROM stream_events_stage ON CONFLICT DO NOTHING")
        touched = [(gid, p) for gid, p in progress.items() if p.rows]
        if not touched:
            return
        cols = list(zip(*[(gid, p.tenant_id, p.epoch, p.last_seq, p.oldest_seq, p.token_count, p.end_reason,
                           p.ended_at, p.updated_at) for gid, p in touched]))
        conn.execute(
            """
            INSERT INTO stream_progress (generation_id, tenant_id, epoch, last_seq, oldest_seq, token_count,
                                         end_reason, ended_at, updated_at)
            SELECT * FROM unnest(%s::text[], %s::text[], %s::int[], %s::int[], %s::int[], %s::bigint[],
                                 %s::text[], %s::timestamptz[], %s::timestamptz[])
            ON CONFLICT (generation_id) DO UPDATE SET
                tenant_id = EXCLUDED.tenant_id, epoch = EXCLUDED.epoch, last_seq = EXCLUDED.last_seq,
                oldest_seq = EXCLUDED.oldest_seq, token_count = EXCLUDED.token_count,
                end_reason = EXCLUDED.end_reason, ended_at = EXCLUDED.ended_at, updated_at = EXCLUDED.updated_at
            """, [list(c) for c in cols])
        # Keep the last N events of each touched stream.
        conn.execute(
            """
            DELETE FROM stream_events s USING stream_progress p
            WHERE p.generation_id = ANY(%s) AND s.generation_id = p.generation_id AND s.seq < p.oldest_seq
            """, ([gid for gid, _ in touched],))
        interrupted = [r[0] for r in conn.execute(
            "SELECT generation_id FROM billing_ledger WHERE generation_id = ANY(%s) AND usage_label = 'interrupted'",
            ([gid for gid, _ in touched],)).fetchall()]
        if interrupted:
            lock_generations(conn, interrupted)
            for generation_id in sorted(interrupted):
                refresh_unbilled_tail(conn, generation_id)

    def trim_ended(self, conn: psycopg.Connection, limit: int) -> int:
        """Drop buffers of streams that ended `keep_after_end` of log time ago; at most `limit` streams."""
        ended = conn.execute(
            """
            UPDATE stream_progress SET oldest_seq = last_seq + 1
            WHERE generation_id IN (
                SELECT generation_id FROM stream_progress
                WHERE ended_at IS NOT NULL AND oldest_seq <= last_seq
                  AND ended_at < (SELECT max(updated_at) FROM stream_progress) - %s
                ORDER BY ended_at LIMIT %s)
            RETURNING generation_id
            """, (self.keep_after_end, limit)).fetchall()
        if ended:
            conn.execute("DELETE FROM stream_events WHERE generation_id = ANY(%s)", ([r[0] for r in ended],))
        return len(ended)
