"""What every sink shares: how an answer is classified, retried and, for batches, narrowed to one event.

    429, 408, 5xx, no answer  SinkUnavailable: sent again, after a backoff, with the same ids
    any other 4xx             SinkRefused: the event is dead-lettered with the sink's reason
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from projections.export.ledger import Outcome
from projections.export.records import Export

log = logging.getLogger(__name__)

T = TypeVar("T")


class SinkUnavailable(Exception):
    """The sink did not take the request now; `retry_after` is its own hint in seconds, if it gave one."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class SinkRefused(Exception):
    """The sink refused the request for good (a 4xx other than 408/429)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Stopped(Exception):
    """The exporter was asked to stop while a request waited to be sent again: nothing is recorded."""


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.2
    max_s: float = 30.0

    def delays(self):
        delay = self.first_s
        while True:
            yield delay * random.uniform(0.5, 1.0)  # jittered: exporters retrying together spread out
            delay = min(delay * 2, self.max_s)


class Sink(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def deliver(self, exports: Sequence[Export], stop: asyncio.Event) -> list[Outcome]:
        """One outcome per export, once the sink has answered for each; raises Stopped if `stop` is set first."""
        ...


async def until_answered(send: Callable[[], Awaitable[T]], stop: asyncio.Event, backoff: Backoff,
                         on_retry: Callable[[str], None], what: str) -> T:
    """`send()` until it does not raise SinkUnavailable (SinkRefused passes through)."""
    delays = backoff.delays()
    while True:
        try:
            return await send()
        except SinkUnavailable as exc:
            delay = min(exc.retry_after, backoff.max_s) if exc.retry_after is not None else next(delays)
            on_retry(exc.reason)
            log.warning("sink unavailable, retrying with the same ids what=%s reason=%s in_s=%.2f",
                        what, exc.reason, delay)
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                continue
            raise Stopped() from None


async def bisecting(send_batch: Callable[[Sequence[Export]], Awaitable[None]],
                    exports: Sequence[Export]) -> list[Outcome]:
    """Send a batch; when the sink refuses it, send each half, down to the events it refuses alone.

    A batch API refuses a whole request for one bad event; halving costs log2(batch) requests per bad event
    and sends every good one (again, with the same id, which the sink deduplicates)."""
    try:
        await send_batch(exports)
    except SinkRefused as exc:
        if len(exports) == 1:
            return [Outcome(exports[0].seal, exc.reason)]
        half = len(exports) // 2
        return await bisecting(send_batch, exports[:half]) + await bisecting(send_batch, exports[half:])
    return [Outcome(export.seal) for export in exports]


def chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i:i + size] for i in range(0, len(items), size)]
