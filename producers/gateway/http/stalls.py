"""Clients that stop reading: their connection is aborted once a write has made no progress for a while.

A stream's bounded queue (BoundedDelivery, `streams/delivery.py`) caps how many events one
connection can make the gateway hold; below it the server's transport buffer
(uvicorn's flow control: 64 KiB) caps the bytes. Neither ends a connection
whose client never reads again: its last send simply waits for room forever.
`GatewayApp` therefore wraps every connection's ASGI `send`: when a send has to
wait for the transport to drain and gets no room for `stream_stall_timeout_s`,
the connection is aborted (a TCP reset: buffered bytes are dropped, so nothing
is left waiting on the socket) and the request's handler is stopped. The client
resumes from the last seq it holds (`Last-Event-ID` / `?after=`).

The transport is found as uvicorn passes it, on the bound `send` of its
connection object; under another server (or an in-process test transport) no
transport is found and a stalled send only stops the handler.
"""
from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI

log = logging.getLogger(__name__)


class ClientStalled(Exception):
    """A send made no progress within the stall timeout; the connection was aborted."""


def guard_send(send, stall_s: float, path: str):
    """`send`, bounded in time whenever it may block (the transport still holds unsent bytes)."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)

    async def guarded(message) -> None:
        if transport is not None and not transport.get_write_buffer_size():
            await send(message)  # everything before was flushed: this write cannot wait for room
            return
        try:
            async with asyncio.timeout(stall_s):
                await send(message)
        except TimeoutError:
            log.info("client stalled path=%s stall_s=%.1f aborted=%s", path, stall_s, transport is not None)
            if transport is not None:
                transport.abort()
            raise ClientStalled(path) from None

    return guarded


def only_stalls(group: BaseExceptionGroup) -> bool:
    return group.subgroup(lambda e: not isinstance(e, (ClientStalled, BaseExceptionGroup))) is None


class GatewayApp(FastAPI):
    """FastAPI whose connections are aborted when their client stops reading (see the module doc)."""

    stall_timeout_s: float = 10.0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await super().__call__(scope, receive, send)
            return
        try:
            await super().__call__(scope, receive, guard_send(send, self.stall_timeout_s, scope.get("path", "")))
        except ClientStalled:
            pass  # the handler stopped on an aborted connection: nothing left to answer
        except BaseExceptionGroup as group:  # a task group (streaming responses) wraps what its tasks raised
            if not only_stalls(group):
                raise
