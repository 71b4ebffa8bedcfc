"""Native streams of one generation: resume cursors and the event source (`streams/delivery.py` queues it for one
connection, `streams/events.py` writes its events).

    resume buffer (Postgres) ──┐
                               ├──▶ source ──▶ BoundedDelivery ──▶ one client
    bridge view (llm.tokens) ──┘

A cursor is the seq of the last event a client holds (SSE `id:` / `Last-Event-ID`,
or `?after=`). The events after it come from the bridge's in-memory view when
that view holds them all; otherwise from the resume buffer first and the bridge
after, the buffer filling any hole between the two, so nothing is skipped or
repeated. A cursor older than both is refused as `cursor_expired`.

An ended generation the bridge does not hold is ended from the buffer, but only
once the buffer holds every token its status's usage counts (for an interruption:
what was billed): the projector applies llm.tokens apart from llm.generations, and
a final event before those tokens would end the client's stream short of its bill.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from producers.gateway.database import BufferedEvent, GatewayDatabase, StreamProgress
from producers.gateway.errors import ApiError
from producers.gateway.native.status import TERMINAL
from producers.gateway.streams.bridge import StreamBridge
from producers.gateway.streams.events import StreamEvent, buffered_event, final_payload, token_event
from producers.gateway.streams.generation_view import GenerationView

log = logging.getLogger(__name__)

FOLLOW_TIMEOUT_S = 600.0
GAP_WAIT_S = 5.0  # how long a hole between buffer and bridge may wait for the projector before it is an error


def parse_cursor(last_event_id: str | None, after: str | None) -> int:
    """The seq a client already holds; `Last-Event-ID` (sent by a reconnecting EventSource) wins over `?after=`."""
    raw = last_event_id if last_event_id not in (None, "") else after
    if raw in (None, ""):
        return 0
    try:
        cursor = int(raw)
    except ValueError:
        cursor = -1
    if cursor < 0:
        raise ApiError(400, "invalid_request", "after / Last-Event-ID must be a seq (an integer >= 0)",
                       {"fields": ["after"]})
    return cursor


def holds_after(view: GenerationView, after: int) -> bool:
    """Whether the bridge's view has every event after `after` (it saw the admission, or its first seq is next)."""
    if view.request_id is not None:
        return True
    return bool(view.tokens) and view.tokens[0].seq <= after + 1


async def open_source(bridge: StreamBridge, db: GatewayDatabase, generation_id: str, status: dict,
                      after: int) -> AsyncIterator[StreamEvent] | None:
    """The events after `after`; None when the client already holds the final one.

    Raises ApiError 410 `cursor_expired` before anything is sent when neither the
    bridge nor the resume buffer holds the event after the cursor.
    """
    view = bridge.view(generation_id)
    if view is not None and holds_after(view, after):
        if view.final is not None and view.final.seq <= after:
            return None
        return follow_live(bridge, db, generation_id, after)
    progress = await db.stream_progress(generation_id)
    epoch = status.get("epoch")
    if progress is not None and progress.epoch == epoch and after < progress.oldest_seq - 1:
        log.info("cursor expired generation=%s after=%d oldest=%d", generation_id, after, progress.oldest_seq)
        raise ApiError(410, "cursor_expired", "the events after this cursor are no longer retained",
                       {"generationId": generation_id, "after": after, "oldestSeq": progress.oldest_seq})
    if status["status"] in TERMINAL and progress is not None and progress.epoch == epoch \
            and holds_usage(progress, status) and after >= final_seq_of(progress):
        return None
    return follow_buffer(bridge, db, generation_id, status, after)


def holds_usage(progress: StreamProgress | None, status: dict) -> bool:
    """The resume buffer holds every output token the status's usage counts."""
    counted = status["usage"]["outputTokens"]
    return counted == 0 or (progress is not None and progress.epoch == status.get("epoch")
                            and progress.token_count >= counted)


def final_seq_of(progress: StreamProgress) -> int:
    """The final event's seq: the worker's final event, or the one written for it after the last token."""
    return progress.last_seq if progress.end_reason else progress.last_seq + 1


async def follow_buffer(bridge: StreamBridge, db: GatewayDatabase, generation_id: str, status: dict,
                        after: int) -> AsyncIterator[StreamEvent]:
    """A stream the bridge did not see whole: the resume buffer after `after`, then live events (or, ended,
    the final event once the buffer holds what the status counts)."""
    ended = status["status"] in TERMINAL
    if ended and not await buffer_holds_usage(db, generation_id, status):
        yield StreamEvent("error", {"code": "stream_behind", "generationId": generation_id, "lastSeq": after,
                                    "message": "the stored stream does not hold all its tokens yet; resume"})
        return
    last_seq = after
    epoch = status.get("epoch")
    if epoch:
        for row in await db.stream_rows(generation_id, epoch, after):
            yield buffered_event(generation_id, epoch, row, row.token_count)
            last_seq = row.seq
    if ended:
        progress = await db.stream_progress(generation_id)
        final_seq = final_seq_of(progress) if progress is not None and progress.epoch == epoch else last_seq + 1
        label = "interrupted" if status["status"] == "interrupted" else "final"
        yield StreamEvent("final", {"id": generation_id, "reason": status["endReason"] or status["status"],
                                    "seq": final_seq, "usageLabel": label, "usage": status["usage"]}, final_seq)
        return
    async for event in follow_live(bridge, db, generation_id, last_seq):
        yield event


async def buffer_holds_usage(db: GatewayDatabase, generation_id: str, status: dict) -> bool:
    """Whether the buffer holds the tokens the status counts, waiting out the projector's lag up to GAP_WAIT_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GAP_WAIT_S
    while True:
        progress = await db.stream_progress(generation_id)
        if holds_usage(progress, status):
            return True
        if loop.time() > deadline:
            log.warning("stored stream behind its status generation=%s counted=%d stored=%s", generation_id,
                        status["usage"]["outputTokens"], None if progress is None else progress.token_count)
            return False
        await asyncio.sleep(0.1)


async def follow_live(bridge: StreamBridge, db: GatewayDatabase, generation_id: str,
                      after: int) -> AsyncIterator[StreamEvent]:
    """The bridge's events after `after`; a hole before the view's first token event, or before its final event
    when it holds none of the tokens (a view whose partition was started where the projections stood, after
    them), is filled from the buffer."""
    last_seq = after
    async for kind, item in bridge.follow(generation_id, timeout_s=FOLLOW_TIMEOUT_S, after_seq=after):
        if kind == "timeout":
            yield StreamEvent("error", {"code": "stream_timeout", "message": "no final event in time", "details": {}})
            return
        if kind == "final" or item.seq > last_seq + 1:  # not per token: only a final or a hole needs a look
            item, epoch, rows = await with_hole_before(bridge, db, generation_id, kind, item, last_seq)
            if rows is None:
                yield StreamEvent("error", {"code": "cursor_expired", "generationId": generation_id,
                                            "message": "events between the cursor and the live stream are "
                                                       "no longer retained", "lastSeq": last_seq})
                return
            # Counts from the live token event backwards (the buffer's own counts may be newer than its rows);
            # before a final event every row is there, and the buffer's counts are its own.
            count = item.token_count - len(item.token_ids) if kind == "token" else None
            for event in buffered_events(generation_id, epoch, rows, count):
                yield event
        if kind == "token":
            yield token_event(generation_id, item.epoch, item.seq, item.token_ids, item.text_delta, item.token_count,
                              item.logprobs, item.prompt_logprobs, item.choice, item.choice_end)
            last_seq = item.seq
        else:
            yield StreamEvent("final", final_payload(item, generation_id), item.seq)


async def with_hole_before(bridge: StreamBridge, db: GatewayDatabase, generation_id: str, kind: str, item,
                           last_seq: int) -> tuple[object, int, list[BufferedEvent] | None]:
    """A followed token or final event, its epoch, and the buffered token events between `last_seq` and it (none
    when it is next; None when they did not all come within GAP_WAIT_S). A view whose partition was started where
    the projections stood may lack the stream's start: its first event then comes after a hole.

    The bridge writes the final of an end no worker writes (an interruption) one seq after the last token its view
    holds: in a view that holds none, that is seq 1, ahead of the tokens the buffer has, so such a final is placed
    after those."""
    view = bridge.view(generation_id)
    epoch = item.epoch if kind == "token" else (view.current_epoch if view is not None else 1)
    if kind == "final" and (view is None or not view.tokens):
        progress = await db.stream_progress(generation_id)
        if progress is not None and progress.epoch == epoch and final_seq_of(progress) > item.seq:
            item = replace(item, seq=final_seq_of(progress))
    if item.seq <= last_seq + 1:
        return item, epoch, []
    return item, epoch, await gap_rows(db, generation_id, epoch, last_seq, item.seq)


def buffered_events(generation_id: str, epoch: int, rows: list[BufferedEvent],
                    count_before: int | None) -> list[StreamEvent]:
    """Token events of buffered rows. `count_before`: the token count the last of them ends at (None: the buffer's
    own counts)."""
    if count_before is None:
        return [buffered_event(generation_id, epoch, row, row.token_count) for row in rows]
    count = count_before
    events = []
    for row in reversed(rows):
        events.append(buffered_event(generation_id, epoch, row, count))
        count -= len(row.token_ids)
    return events[::-1]


async def gap_rows(db: GatewayDatabase, generation_id: str, epoch: int, last_seq: int,
                   before_seq: int) -> list[BufferedEvent] | None:
    """The resume buffer's token events of `epoch` after `last_seq` and before `before_seq`, once it holds every
    one of them (waiting out the projector's lag); None when they do not all come within GAP_WAIT_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GAP_WAIT_S
    while True:
        rows = [r for r in await db.stream_rows(generation_id, epoch, last_seq) if r.seq < before_seq]
        if [r.seq for r in rows] == list(range(last_seq + 1, before_seq)):
            return rows
        if loop.time() > deadline:
            return None
        await asyncio.sleep(0.1)
