"""Native streams of one generation: resume cursors, the event source, and a bounded queue per connection.

    resume buffer (Postgres) ──┐
                               ├──▶ source ──fill──▶ bounded queue ──▶ one client
    bridge view (llm.tokens) ──┘        (at most stream_queue_events)

A cursor is the seq of the last event a client holds (SSE `id:` / `Last-Event-ID`,
or `?after=`). The events after it come from the bridge's in-memory view when
that view holds them all; otherwise from the resume buffer first and the bridge
after, the buffer filling any hole between the two, so nothing is skipped or
repeated. A cursor older than both is refused as `cursor_expired`.

An ended generation the bridge does not hold is ended from the buffer, but only
once the buffer holds every token its status's usage counts (for an interruption:
what was billed): the projector applies llm.tokens apart from llm.generations, and
a final event before those tokens would end the client's stream short of its bill.

The queue bounds what one connection can make the server hold: the source stops
at the bound and the stream ends with a `slow_consumer` error naming the last
seq sent, from which the client resumes.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import WebSocket
from fastapi.responses import StreamingResponse

from producers.gateway.bridge import StreamBridge
from producers.gateway.generation_view import FinalEvent, GenerationView
from producers.gateway.database import GatewayDatabase, StreamProgress
from producers.gateway.presence import Presence
from producers.gateway.errors import ApiError
from producers.gateway.status import TERMINAL

log = logging.getLogger(__name__)

FOLLOW_TIMEOUT_S = 600.0
GAP_WAIT_S = 5.0  # how long a hole between buffer and bridge may wait for the projector before it is an error
# A full queue waits this long for the client to take an event before the client is a slow consumer, so a
# replay of a long stream (bursts far past the bound) is not cut short for a client that keeps reading.
SLOW_CONSUMER_GRACE_S = 1.0


@dataclass(frozen=True)
class StreamEvent:
    kind: str  # "token" | "final" | "error"
    data: dict
    seq: int | None = None
    encoded: str | None = None  # `data` as JSON when it was built that way (token events: the hot path)

    def as_message(self) -> dict:
        """The WebSocket form: the SSE event name as `type`, then its data."""
        return {"type": self.kind, **self.data}


def sse(event: str, data: dict, event_id: int | None = None, encoded: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = encoded if encoded is not None else json.dumps(data, separators=(',', ':'))
    return f"{head}event: {event}\ndata: {body}\n\n".encode()


def final_payload(final: FinalEvent, generation_id: str) -> dict:
    usage = final.usage
    return {"id": generation_id, "reason": final.reason, "seq": final.seq, "usageLabel": final.usage_label,
            "usage": {"inputTokens": usage.processed_input_tokens, "cachedInputTokens": usage.cached_input_tokens,
                      "outputTokens": usage.generated_output_tokens}}


_quote = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str, without its dispatch


def logprob_entries(entries) -> list[dict]:
    """The native form of `schemas.stream.TokenLogprob`s: {tokenId, logprob, top: [[id, logprob], ...]}."""
    return [{"tokenId": e.token_id, "logprob": e.logprob, "top": [list(pair) for pair in e.top]} for e in entries]


def token_event(generation_id: str, epoch: int, seq: int, token_ids, text: str, token_count: int,
                logprobs=None, prompt_logprobs=None, choice: int = 0, choice_end: str | None = None) -> StreamEvent:
    """A token event; `logprobs` / `promptLogprobs` appear only when the generation asked for them, `choice`
    (absent: 0) and `choiceEnd` only for a generation of n > 1 choices."""
    ids = list(token_ids)
    quoted = _quote(text)
    data = {"generationId": generation_id, "epoch": epoch, "seq": seq, "tokenIds": ids, "text": text,
            "textDelta": text, "tokenCount": token_count}
    if logprobs is not None or prompt_logprobs is not None or choice or choice_end is not None:
        if logprobs is not None:
            data["logprobs"] = logprob_entries(logprobs)
        if prompt_logprobs is not None:
            data["promptLogprobs"] = logprob_entries(prompt_logprobs)
        if choice or choice_end is not None:
            data["choice"] = choice
            data["choiceEnd"] = choice_end
        return StreamEvent("token", data, seq)
    # The same JSON json.dumps would write for `data`, formatted directly: every streamed token passes here.
    encoded = (f'{{"generationId":{_quote(generation_id)},"epoch":{epoch:d},"seq":{seq:d},'
               f'"tokenIds":[{",".join(map(str, ids))}],"text":{quoted},"textDelta":{quoted},'
               f'"tokenCount":{token_count:d}}}')
    return StreamEvent("token", data, seq, encoded)


def buffered_event(generation_id: str, epoch: int, row, token_count: int) -> StreamEvent:
    """A token event from the resume buffer (`producers.gateway.database.BufferedEvent`)."""
    return token_event(generation_id, epoch, row.seq, row.token_ids, row.text, token_count, row.logprobs(),
                       row.logprobs("prompt_logprobs"), row.choice, row.choice_end)


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
    """The bridge's events after `after`; a hole before the view's first event is filled from the buffer."""
    last_seq = after
    async for kind, item in bridge.follow(generation_id, timeout_s=FOLLOW_TIMEOUT_S, after_seq=after):
        if kind == "token":
            if item.seq > last_seq + 1:
                filled = await fill_gap(db, generation_id, item, last_seq)
                if filled is None:
                    yield StreamEvent("error", {"code": "cursor_expired", "generationId": generation_id,
                                                "message": "events between the cursor and the live stream are "
                                                           "no longer retained", "lastSeq": last_seq})
                    return
                for event in filled:
                    yield event
            yield token_event(generation_id, item.epoch, item.seq, item.token_ids, item.text_delta, item.token_count,
                              item.logprobs, item.prompt_logprobs, item.choice, item.choice_end)
            last_seq = item.seq
        elif kind == "final":
            yield StreamEvent("final", final_payload(item, generation_id), item.seq)
        else:
            yield StreamEvent("error", {"code": "stream_timeout", "message": "no final event in time", "details": {}})


async def fill_gap(db: GatewayDatabase, generation_id: str, first_live, last_seq: int) -> list[StreamEvent] | None:
    """The buffered events between `last_seq` and the bridge's first event; waits out the projector's lag."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GAP_WAIT_S
    while True:
        rows = [r for r in await db.stream_rows(generation_id, first_live.epoch, last_seq) if r.seq < first_live.seq]
        if [r.seq for r in rows] == list(range(last_seq + 1, first_live.seq)):
            # Counts from the live event backwards: the buffer's own counts may be newer than its rows.
            count = first_live.token_count - len(first_live.token_ids)
            events = []
            for row in reversed(rows):
                events.append(buffered_event(generation_id, first_live.epoch, row, count))
                count -= len(row.token_ids)
            return events[::-1]
        if loop.time() > deadline:
            return None
        await asyncio.sleep(0.1)


class BoundedDelivery:
    """One connection's queue: the source fills it, the client drains it, and a full queue ends the stream.

    When `limit` events are waiting and the client takes none for SLOW_CONSUMER_GRACE_S,
    the source stops (so memory per connection is bounded by `limit` events) and the
    client is sent `slow_consumer` with the last seq it was sent, from which it resumes.
    """

    END = StreamEvent("end", {})

    def __init__(self, source: AsyncIterator[StreamEvent], limit: int, after: int, generation_id: str,
                 presence: Presence | None = None, live: set | None = None) -> None:
        self.source = source
        self.presence = presence
        self.live = live if live is not None else set()
        self.limit = limit
        self.last_seq = after
        self.generation_id = generation_id
        self.queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.overflowed = False
        self.taken = asyncio.Event()

    async def _fill(self) -> None:
        try:
            async for event in self.source:
                if self.queue.qsize() >= self.limit and not await self._wait_for_room():
                    self.overflowed = True
                    log.info("slow consumer generation=%s queued=%d last_seq=%d", self.generation_id,
                             self.queue.qsize(), self.last_seq)
                    return
                self.queue.put_nowait(event)
        except ApiError as exc:  # e.g. database_unavailable reading the resume buffer: resume after Retry-After
            log.warning("stream source refused generation=%s code=%s", self.generation_id, exc.code)
            details = {**exc.details, "retryAfterMs": exc.retry_after_ms} if exc.retry_after_ms else exc.details
            self.queue.put_nowait(StreamEvent("error", {"code": exc.code, "message": exc.message,
                                                        "details": details}))
        except Exception as exc:  # the client gets an error event, not a silently truncated stream
            log.warning("stream source failed generation=%s error=%s", self.generation_id, type(exc).__name__)
            self.queue.put_nowait(StreamEvent("error", {"code": "internal", "message": "stream source failed"}))
        finally:
            self.queue.put_nowait(self.END)  # one past the bound at most

    async def _wait_for_room(self) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SLOW_CONSUMER_GRACE_S
        while self.queue.qsize() >= self.limit:
            self.taken.clear()
            try:
                await asyncio.wait_for(self.taken.wait(), deadline - loop.time())
            except TimeoutError:
                return False
        return True

    async def batches(self, most: int = 64) -> AsyncIterator[list[StreamEvent]]:
        """What the client is sent, as runs of the events waiting together (one write each), in order."""
        filler = asyncio.create_task(self._fill(), name=f"stream-fill-{self.generation_id}")
        ended = False
        self.live.add(self)
        if self.presence is not None:
            self.presence.attach(self.generation_id)
        try:
            while True:
                batch = [await self.queue.get()]
                self.taken.set()
                if self.overflowed:
                    yield [StreamEvent("error", {"code": "slow_consumer", "lastSeq": self.last_seq,
                                                 "message": f"the client fell {self.limit} events behind; "
                                                            f"resume with after={self.last_seq}"})]
                    return
                while len(batch) < most and batch[-1] is not self.END and not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                done = batch[-1] is self.END
                if done:
                    batch.pop()
                if batch:
                    yield batch
                    ended = ended or any(event.kind == "final" for event in batch)
                    seqs = [event.seq for event in batch if event.seq is not None]
                    if seqs:
                        self.last_seq = seqs[-1]  # sent: the transport took them before control came back
                if done:
                    return
        finally:
            filler.cancel()
            self.live.discard(self)
            self.queue = asyncio.Queue()
            if self.presence is not None:
                # A slow consumer cut at the bound is expected to resume: that is a detach like any other.
                self.presence.detach(self.generation_id, ended)

    async def events(self) -> AsyncIterator[StreamEvent]:
        """The same events one by one."""
        async with aclosing(self.batches()) as batches:
            async for batch in batches:
                for event in batch:
                    yield event


async def sse_body(first: dict, delivery: BoundedDelivery) -> AsyncIterator[bytes]:
    yield sse("generation", first)
    async with aclosing(delivery.batches()) as batches:  # a closed body closes the delivery at once, not at GC
        async for batch in batches:
            yield b"".join(sse(event.kind, event.data, event.seq, event.encoded) for event in batch)


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that closes its body however it ends (a hang-up, an aborted connection), so
    the body's `finally` blocks (queue release, presence detach) run now rather than whenever the
    collector reaches a generator kept alive by a traceback. `on_close` (a tenant's stream slot) runs last."""

    on_close = None

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                if self.on_close is not None:
                    self.on_close()


# WebSocket close codes (4000 + the HTTP status where one applies; 4008 as RFC 6455's 1008 policy violation).
WS_CLOSE_SLOW_CONSUMER = 4008
WS_CLOSE_OF_STATUS = {400: 4400, 401: 4401, 404: 4404, 410: 4410}


async def serve_websocket(websocket: WebSocket, first: dict, delivery: BoundedDelivery) -> None:
    """The same events as JSON messages (`type` = the SSE event name); ends with close 1000 after the final
    event, or 4008 `slow_consumer lastSeq=N` at the queue bound. A client hanging up stops the delivery."""

    async def send_all() -> None:
        await websocket.send_json({"type": "generation", **first})
        async with aclosing(delivery.events()) as events:
            async for event in events:
                await websocket.send_json(event.as_message())
                if event.kind == "error" and event.data.get("code") == "slow_consumer":
                    await websocket.close(WS_CLOSE_SLOW_CONSUMER, f"slow_consumer lastSeq={event.data['lastSeq']}")
                    return
        await websocket.close(1000, "end")

    async def until_hang_up() -> None:
        while (await websocket.receive())["type"] != "websocket.disconnect":
            pass

    sender = asyncio.create_task(send_all())
    listener = asyncio.create_task(until_hang_up())
    try:
        await asyncio.wait({sender, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sender, listener):
            task.cancel()
        await asyncio.gather(sender, listener, return_exceptions=True)
    if sender.done() and not sender.cancelled() and sender.exception() is not None:
        log.info("websocket send failed generation=%s error=%s", delivery.generation_id,
                 type(sender.exception()).__name__)


async def close_with_error(websocket: WebSocket, error: ApiError) -> None:
    """A refusal after the handshake: the error shape as one message, then a close naming the code."""
    await websocket.send_json({"type": "error", "code": error.code, "message": error.message,
                               "details": error.details})
    reason = error.code if "oldestSeq" not in error.details else f"{error.code} oldestSeq={error.details['oldestSeq']}"
    await websocket.close(WS_CLOSE_OF_STATUS.get(error.status, 4000 + error.status), reason)
