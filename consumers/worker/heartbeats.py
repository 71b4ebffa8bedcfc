"""A worker's heartbeats: capacity, load and every attempt it holds (`Worker.heartbeat`), sent every interval
from a thread of their own (heartbeat_thread.py); a worker that cannot send them for a lease fences itself,
since the controller has given its attempts up by then. Its upkeep (overdue and waiting attempts,
`DispatchOrders._upkeep`) runs on the worker's loop, never in their way."""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Protocol

from consumers.worker.engine_thread import EngineStopped, EngineThread
from plumbing.settings import Settings

log = logging.getLogger(__name__)


class Leaseholder(Protocol):
    """What the heartbeats need of their worker: who it is, when a heartbeat was last acknowledged, when the
    newest one was stamped for sending, how to send one, to fence itself, and whether a drain has ended all its
    work."""

    settings: Settings
    worker_id: str
    last_heartbeat_ok: float
    # time.monotonic() where the newest heartbeat's `occurred_at` was stamped: the instant the controller
    # counts its lease from (set by `send_heartbeat`, after it has waited for a description)
    heartbeat_stamped_at: float

    @property
    def drained(self) -> bool: ...

    async def send_heartbeat(self) -> asyncio.Future: ...

    def fence_all(self) -> None: ...


# A worker whose heartbeats nobody has acknowledged for this many leases gives its attempts up even while
# some are still on their way: by then a broker that takes none of them is lost to it, not slow.
GIVE_UP_LEASES = 3


class HeartbeatAcks:
    """The heartbeats on their way to the broker and when each was sent: whether the worker may still hold
    its lease.

    The controller counts a lease from a heartbeat's sending, as of the time it has read the heartbeats
    through (`WorkerHeartbeat.within_lease`). A heartbeat the broker has not acknowledged yet may still be
    written: while one sent within the fence horizon is on its way (a frozen or busy broker, a producer queue
    behind token batches, this process starved of CPU), the controller cannot have read past it either, so
    the worker keeps its work. It fences when every heartbeat of the horizon failed, or when nothing has been
    acknowledged for GIVE_UP_LEASES leases."""

    def __init__(self, worker: Leaseholder) -> None:
        self.worker = worker
        self.in_flight: dict[asyncio.Future, float] = {}
        interval = worker.settings.heartbeat_interval_ms / 1000
        # One check early: the controller counts the lease from the heartbeat, not from our acknowledgement
        # of it, and the loop only looks every `interval`.
        self.fence_after = max(worker.settings.lease_ms / 1000 - interval, interval)
        self.give_up_after = GIVE_UP_LEASES * worker.settings.lease_ms / 1000

    def sent(self, delivery: asyncio.Future, sent_at: float) -> None:
        self.in_flight[delivery] = sent_at
        delivery.add_done_callback(functools.partial(self.settled, sent_at))

    def settled(self, sent_at: float, delivery: asyncio.Future) -> None:
        """A heartbeat the broker took renews the lease from when it was sent, however late the
        acknowledgement (its wait is never cut short); a failed one only leaves the in-flight set."""
        self.in_flight.pop(delivery, None)
        if delivery.cancelled() or delivery.exception() is not None:
            error = "CancelledError" if delivery.cancelled() else type(delivery.exception()).__name__
            log.warning("heartbeat failed worker=%s error=%s", self.worker.worker_id, error)
            return
        self.worker.last_heartbeat_ok = max(self.worker.last_heartbeat_ok, sent_at)

    def must_fence(self, now: float) -> bool:
        acked = self.worker.last_heartbeat_ok
        if now - acked > self.give_up_after:
            return True
        return now - max([acked, *self.in_flight.values()]) > self.fence_after


async def heartbeat_loop(worker: Leaseholder, thread: EngineThread, fence: Callable[[], None]) -> None:
    """Until a drain has ended every attempt: heartbeat, and self-fence (`fence()`) once the controller may have
    given the lease up (`HeartbeatAcks`); a dead engine `thread` stops the worker (`EngineStopped`). It runs on
    a thread of its own (heartbeat_thread.py).

    A worker with about 1,000 attempts on it fenced itself in `bench intake` (10,000 requests): its heartbeat
    sends timed out although the broker was there, and the upkeep of waiting attempts ran in this loop too.
    So nothing else runs here (the upkeep runs beside it), and an acknowledgement is awaited by a callback,
    never cut short. A fleet of test workers fenced itself on a loaded machine (`ConnectionError`s while the
    broker was starved): a heartbeat still on its way now holds the lease as the controller would.
    """
    interval = worker.settings.heartbeat_interval_ms / 1000
    acks = HeartbeatAcks(worker)
    while True:
        if not thread.alive:
            raise EngineStopped(f"the engine thread of {worker.worker_id} died")
        sent_at = time.monotonic()
        try:
            delivery = await asyncio.wait_for(worker.send_heartbeat(), timeout=interval)
            # Counted from where the record was stamped, as the controller counts it, not from before the wait
            # for a description: a worker frozen (SIGSTOP) inside that wait fenced itself as it woke from a 3 s
            # freeze, its stamp then older than lease - interval though the record it sent was not (chaos, 2026-12-06).
            acks.sent(delivery, max(sent_at, worker.heartbeat_stamped_at))
        except Exception as exc:  # the broker may be away; the lease decides what that means
            log.warning("heartbeat failed worker=%s error=%s", worker.worker_id, type(exc).__name__)
        if acks.must_fence(time.monotonic()):
            fence()
        if worker.drained:
            return
        await asyncio.sleep(interval)
