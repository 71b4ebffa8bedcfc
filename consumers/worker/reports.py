"""Usage watermarks that never count a stream event the log does not hold.

A worker's stream events (`llm.tokens`) and its watermarks (`llm.generations`)
are different partitions, usually led by different brokers, and the producer
sends one request per broker at a time: a watermark can be written while the
stream events it counts still wait behind a slow or dead leader. A kill -9, or
a batch that expires, then loses them, and the Interrupted seal bills the last
watermark: the client would pay for tokens it never received. So a watermark
goes out only once every stream event sent before it is acknowledged, in the
order the watermarks were made, and the attempt's end waits the same way.

    TokensEmitted 1..k ──acks──┐
    UsageReported(k) ──────────┴─▶ sent ─▶ (next watermark waits for this one, then its own events)
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class StreamDeliveries:
    """One attempt's stream events not yet acknowledged, and the last watermark waiting on them."""

    def __init__(self) -> None:
        self._waiting: list[asyncio.Future] = []
        self._last_report: asyncio.Task | None = None

    def add(self, delivery: asyncio.Future | None) -> None:
        """A stream event's delivery (None: its send failed at once, which already gave the attempt up)."""
        if delivery is not None:
            self._waiting = self.undelivered()
            self._waiting.append(delivery)

    def undelivered(self) -> list[asyncio.Future]:
        """Deliveries not acknowledged: still on their way, or failed."""
        return [d for d in self._waiting if not d.done() or d.cancelled() or d.exception() is not None]

    async def report(self, send: Callable[[], Awaitable[None]], tasks: set[asyncio.Task]) -> None:
        """`send()` the watermark now when nothing it counts is still on its way, else once all of it is
        acknowledged (a task, kept in `tasks`); never when some of it was not delivered: the attempt is
        given up for that, and its last delivered watermark stands."""
        waiting = self.undelivered()
        previous = self._last_report
        if not waiting and (previous is None or previous.done()):
            await send()
            return
        task = asyncio.create_task(self._when_delivered(waiting, previous, send))
        self._last_report = task
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    @staticmethod
    async def _when_delivered(waiting: list[asyncio.Future], previous: asyncio.Task | None,
                              send: Callable[[], Awaitable[None]]) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # watermarks in the order they were made
        try:
            await asyncio.gather(*waiting)
        except Exception:
            return
        await send()

    async def settled(self) -> None:
        """Every stream event sent so far acknowledged (else its error) and every waiting watermark sent."""
        await asyncio.gather(*self.undelivered())
        if self._last_report is not None:
            await asyncio.wait([self._last_report])
