"""One connection's share of a stream: a bounded queue between the source and the client, and the SSE
and WebSocket transports that drain it.

    source ──fill──▶ bounded queue ──▶ SSE body / WebSocket ──▶ one client
                     (at most stream_queue_events)

The queue bounds what one connection can make the server hold: the source stops
at the bound and the stream ends with a `slow_consumer` error naming the last
seq sent, from which the client resumes.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import WebSocket
from fastapi.responses import StreamingResponse

from producers.gateway.errors import ApiError
from producers.gateway.streams.events import StreamEvent, sse
from producers.gateway.streams.presence import Presence

log = logging.getLogger(__name__)

# A full queue waits this long for the client to take an event before the client is a slow consumer, so a
# replay of a long stream (bursts far past the bound) is not cut short for a client that keeps reading.
SLOW_CONSUMER_GRACE_S = 1.0


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
