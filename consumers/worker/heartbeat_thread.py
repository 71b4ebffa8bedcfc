"""Heartbeats on a thread of their own, with their own event loop and producer.

    worker's event loop ── builds the heartbeat (the worker's state lives there) ──▶ newest description
    heartbeat thread    ── every interval: asks for a fresh description, waits at most half an interval,
                           sends the newest one stamped with the time of sending, on its own producer

`bench intake` (10,000 requests, six CPU-bound processes beside the stack) interrupted 512 attempts as
`worker-lease-expired` with the heartbeat on the worker's loop: the loop was busy with the token events of
hundreds of attempts and the heartbeat waited behind them, then behind their batches in the producer. Here a
starved loop delays what a heartbeat says, not the heartbeat. A description stays consistent (built in one go
on the worker's loop: the attempts it lists are those its `dispatch_read_through` has read), only older; the
controller judges its listing and its dispatches as of that read-through time, not of the sending.

A loop that has not described the worker for WEDGED_AFTER_S (or GIVE_UP_LEASES leases, if longer) is taken for
wedged: no heartbeat goes out, so the lease runs out as for a dead worker. Until then the controller sends it at
most its bound of attempts (it counts dispatches the stale description has not seen), and the attempts it holds
are interrupted once it is taken for wedged.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Protocol
from uuid import uuid4

from consumers.worker.engine_thread import EngineThread
from consumers.worker.heartbeats import GIVE_UP_LEASES, Leaseholder, heartbeat_loop
from plumbing.kafka.clients import Kafka, make_producer
from schemas.codec import encode, record_headers, record_key
from schemas.registry_events import WorkerHeartbeat
from schemas.topics import WORKERS

log = logging.getLogger(__name__)

# A stall this long is a wedged loop, not a slow one: in-process test workers share their loop with the tests'
# blocking fixtures (migrations of a scratch database) for several seconds, a starved worker for a few.
WEDGED_AFTER_S = 60.0


class Described(Leaseholder, Protocol):
    """A leaseholder that can describe itself in a heartbeat (on its own loop) and reach the broker."""

    kafka: Kafka

    def heartbeat(self, alive: bool = True) -> WorkerHeartbeat: ...


class StaleDescription(RuntimeError):
    """The worker's loop has not described the worker for a long while (wedged): no heartbeat is sent."""


class HeartbeatThread:
    def __init__(self, worker: Described, engine: EngineThread) -> None:
        self.worker = worker
        self.engine = engine
        self.worker_loop = asyncio.get_running_loop()
        interval = worker.settings.heartbeat_interval_ms / 1000
        self.wait_s = interval / 2
        self.stale_after_s = max(WEDGED_AFTER_S, GIVE_UP_LEASES * worker.settings.lease_ms / 1000)
        self.described_at = time.monotonic()
        self.description = worker.heartbeat()
        self._asked: concurrent.futures.Future | None = None  # a description asked of the worker's loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._producer = None
        self._stopping = threading.Event()
        self._ended: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name=f"{worker.worker_id}-heartbeat", daemon=True)

    def start(self) -> asyncio.Future:
        """Start heartbeating; the future (on the worker's loop) ends with the heartbeat loop: a drain that ended
        every attempt, or an error (`EngineStopped`: the engine thread died)."""
        self._thread.start()
        return asyncio.wrap_future(self._ended)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """No heartbeat after this returns (unless the thread did not end within `timeout_s`)."""
        self._stopping.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not self._ended.done():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # its loop closed meanwhile: the thread has ended
                pass
        await asyncio.wait([asyncio.wrap_future(self._ended)], timeout=timeout_s)

    async def send(self) -> asyncio.Future:
        """The newest description of the worker, stamped now, handed to this thread's producer; the returned
        future is its acknowledgement."""
        description = await self._describe()
        self.worker.heartbeat_stamped_at = time.monotonic()  # with occurred_at: where the lease counts from
        # Built on the worker's loop, a description's own time is when it was described.
        heartbeat = description.model_copy(update={"event_id": uuid4(), "occurred_at": datetime.now(UTC),
                                                   "described_at": description.occurred_at})
        return await self._producer.send(WORKERS, value=encode(heartbeat), key=record_key(WORKERS, heartbeat),
                                         headers=record_headers(heartbeat))

    # -- on the heartbeat thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except asyncio.CancelledError:
            self._ended.set_result(None)  # stopped
        except BaseException as exc:  # handed to the worker's loop, which stops the worker on it
            self._ended.set_exception(exc)
        else:
            self._ended.set_result(None)

    async def _main(self) -> None:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        if self._stopping.is_set():
            return
        self._producer = make_producer(self.worker.kafka, client_id=f"{self.worker.worker_id}-heartbeat",
                                       linger_ms=0)
        await self._producer.start()
        try:
            await heartbeat_loop(self.worker, self.engine, self._fence)
        finally:
            await self._producer.stop()

    def _fence(self) -> None:
        self.worker_loop.call_soon_threadsafe(self.worker.fence_all)

    async def _describe(self) -> WorkerHeartbeat:
        """Ask the worker's loop for a description (one question at a time) and wait a little for it; a later
        answer still becomes the newest. Too old a description is not sent at all (`StaleDescription`)."""
        if self._asked is None or self._asked.done():
            self._asked = asked = concurrent.futures.Future()
            answer = asyncio.wrap_future(asked)
            answer.add_done_callback(self._described)
            self.worker_loop.call_soon_threadsafe(self._build, asked)
            await asyncio.wait([answer], timeout=self.wait_s)
        age = time.monotonic() - self.described_at
        if age > self.stale_after_s:
            raise StaleDescription(f"no description of {self.worker.worker_id} for {age:.1f}s")
        return self.description

    def _described(self, answer: asyncio.Future) -> None:
        if answer.cancelled():
            return
        if answer.exception() is not None:
            log.error("heartbeat not described worker=%s error=%s", self.worker.worker_id,
                      type(answer.exception()).__name__)
            return
        described_at, description = answer.result()
        if described_at > self.described_at:
            self.described_at, self.description = described_at, description

    # -- on the worker's loop ------------------------------------------------------------------
    def _build(self, asked: concurrent.futures.Future) -> None:
        try:
            asked.set_result((time.monotonic(), self.worker.heartbeat()))
        except Exception as exc:
            asked.set_exception(exc)
