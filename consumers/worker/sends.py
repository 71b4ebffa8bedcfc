"""How the worker sends a record: acknowledged before going on, or watched for a failed delivery.

A stream event or a watermark that never reaches the log leaves a hole in a
stream or a bill, yet waiting for each one's acknowledgement would put a
broker round trip into every engine step. `watched` sends without waiting and
reports a send or a delivery that fails to `on_failure`, which gives the
attempt up; the end of an attempt (`acked`) waits for every record.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from schemas.envelope import Envelope

Send = Callable[[str, Envelope], Awaitable[asyncio.Future]]


async def acked(send: Send, topic: str, event: Envelope) -> None:
    """Send and wait until the broker has the record (an exception when it will not)."""
    await (await send(topic, event))


async def watched(send: Send, topic: str, event: Envelope,
                  on_failure: Callable[[BaseException], None]) -> asyncio.Future | None:
    """Send without waiting for the acknowledgement; `on_failure(error)` if the send or the delivery fails.
    Returns the delivery (None when the send failed at once)."""
    try:
        delivery = await send(topic, event)
    except Exception as exc:
        on_failure(exc)
        return None

    def delivered(future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            on_failure(future.exception())

    delivery.add_done_callback(delivered)
    return delivery
