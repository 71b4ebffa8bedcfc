"""A worker's heartbeats: capacity, load and every attempt it holds, sent every interval; a worker that
cannot send them for a lease fences itself, since the controller has given its attempts up by then.
Its upkeep (overdue and waiting attempts) runs beside them, never in their way."""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from consumers.worker.engine_thread import EngineStopped
from schemas.registry_events import MAX_LISTED_ATTEMPTS, WorkerHeartbeat

if TYPE_CHECKING:
    from consumers.worker.runtime import Worker

log = logging.getLogger(__name__)


def held(worker: "Worker") -> tuple[str, ...] | None:
    """"<generation>:<epoch>" of every attempt the worker holds (running, ending, waiting for room), or None
    past MAX_LISTED_ATTEMPTS. An attempt leaves the list once its release is acknowledged (or it was given
    up, when `fenced` names it instead)."""
    listed = [f"{a.start.generation_id}:{a.start.epoch}" for a in worker.attempts.values() if not a.fenced]
    listed += [f"{o.generation_id}:{o.epoch}" for o in worker.waiting]
    return tuple(listed) if len(listed) <= MAX_LISTED_ATTEMPTS else None


def heartbeat_of(worker: "Worker", alive: bool = True) -> WorkerHeartbeat:
    thread = worker._thread  # noqa: SLF001 -- the worker's engine thread, read for its liveness and rate
    queued = sum(len(a.start.input_token_ids) for a in worker.attempts.values() if not a.started_output)
    settings = worker.settings
    return WorkerHeartbeat(worker_id=worker.worker_id, model_versions=(worker.model.model_version,),
                           total_blocks=worker.total_blocks, free_blocks=worker.free_blocks,
                           block_size=worker.block_size, running=len(worker.attempts) + len(worker.waiting),
                           queued_tokens=queued + worker.waiting.queued_tokens,
                           draining=worker.draining, lease_ms=settings.lease_ms,
                           alive=alive and (thread is None or thread.alive),
                           stale_commands=worker.stale_commands, plane=settings.controller_group,
                           fenced=tuple(f"{g}:{e}" for g, e in sorted(worker.self_fenced.items())),
                           reservation=worker.engine.config.reservation,
                           headroom_tokens=settings.worker_headroom_tokens if worker.optimistic else 0,
                           tokens_per_s=thread.tokens_per_s if thread is not None else None,
                           prefill_step_ms=thread.prefill_step_s * 1000
                           if thread is not None and thread.prefill_step_s else None,
                           max_batched_tokens=worker.engine.config.max_num_batched_tokens,
                           incarnation=worker.incarnation, attempts=held(worker),
                           dispatch_read_through=read_through_at(worker))


def read_through_at(worker: "Worker") -> datetime | None:
    at = worker.dispatch_read.read_through(worker.consumer)
    return None if at is None else datetime.fromtimestamp(at, UTC)


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

    def __init__(self, worker: "Worker") -> None:
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


async def heartbeat_loop(worker: "Worker") -> None:
    """Until a drain has ended every attempt: heartbeat, and self-fence once the controller may have given
    the lease up (`HeartbeatAcks`).

    A worker with about 1,000 attempts on it fenced itself in `bench intake` (10,000 requests): its heartbeat
    sends timed out although the broker was there, and the upkeep of waiting attempts ran in this loop too.
    So nothing else runs here (the upkeep is `upkeep_loop`), and an acknowledgement is awaited by a callback,
    never cut short. A fleet of test workers fenced itself on a loaded machine (`ConnectionError`s while the
    broker was starved): a heartbeat still on its way now holds the lease as the controller would.
    """
    interval = worker.settings.heartbeat_interval_ms / 1000
    acks = HeartbeatAcks(worker)
    while True:
        if not worker._thread.alive:  # noqa: SLF001
            raise EngineStopped(f"the engine thread of {worker.worker_id} died")
        sent_at = time.monotonic()
        try:
            acks.sent(await asyncio.wait_for(worker.send_heartbeat(), timeout=interval), sent_at)
        except Exception as exc:  # the broker may be away; the lease decides what that means
            log.warning("heartbeat failed worker=%s error=%s", worker.worker_id, type(exc).__name__)
        if acks.must_fence(time.monotonic()):
            worker.fence_all()
        if worker.draining and not worker.attempts and not worker.has_ends_in_flight and not worker.waiting:
            return
        await asyncio.sleep(interval)


async def upkeep_loop(worker: "Worker") -> None:
    """Every heartbeat interval: give up attempts past their maximum run time, end waiting attempts whose
    deadline passed and start those that fit (deadlines pass even when nothing finishes)."""
    interval = worker.settings.heartbeat_interval_ms / 1000
    while True:
        worker.abort_overdue(time.monotonic())
        if worker.waiting:
            await worker.start_waiting()
        await asyncio.sleep(interval)
