"""The worker process: one engine, its attempts, heartbeats and every event of its generations.

    llm.dispatch[partition of worker id] ─▶ orders (orders.py): StartAttempt, CancelAttempt(epoch), DrainWorker
    engine thread outputs ─▶ stream events, watermarks, the end and the release (writer.py)
    every heartbeat interval ─▶ WorkerHeartbeat (incarnation, attempts held), sent from a thread of its own
                                (heartbeat_thread.py); no acknowledged heartbeat for
                                a lease ─▶ self-fence; an attempt past max_attempt_s + a lease ─▶ given up

Room in the KV pool comes from the engine, the one authority on it: an
attempt holds the engine's reservation from its start until it leaves the
worker (`drop`), and heartbeats report what the engine counts free. An
attempt given up (`fenced`) is named in the heartbeats: the controller then
ends it Interrupted and releases its budget. Heartbeats list every attempt
held under this process's incarnation id, so a restart under the same worker
id loses nothing silently.

If the engine thread dies, the next heartbeat says `alive=false` and the worker
exits (`EngineStopped`, a non-zero exit): the controller interrupts its attempts
at once rather than route to an engine that will never end them.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import UTC, datetime

from consumers.worker.attempts import Attempt
from consumers.worker.calibration import WaitCalibration
from consumers.worker.capacity import KVAccounting
from consumers.worker.engine_setup import engine_config, load_engine  # noqa: F401 -- callers import them here
from consumers.worker.engine_thread import EngineStopped, EngineThread
from consumers.worker.heartbeat_thread import HeartbeatThread
from consumers.worker.orders import DispatchOrders
from consumers.worker.waiting import WaitingQueue
from consumers.worker.writer import AttemptWriter
from engine.request import RequestOutput
from plumbing.kafka.clients import Kafka, make_consumer, make_producer, partitions_of
from plumbing.kafka.follower import ReadThrough, partition_for
from plumbing.settings import Settings
from plumbing.telemetry.metrics import WorkerMetrics
from plumbing.telemetry.server import Readiness, RoleServer
from schemas.codec import encode
from schemas.registry_events import MAX_LISTED_ATTEMPTS, ModelVersionRegistered, WorkerHeartbeat
from schemas.topics import DISPATCH, WORKERS

log = logging.getLogger(__name__)


class Worker(KVAccounting, DispatchOrders, AttemptWriter):
    """One engine's worker: its state lives here, its parts each in their module (capacity.py, orders.py,
    writer.py); here are its lifecycle, its heartbeat and its fencing."""

    def __init__(self, settings: Settings, kafka: Kafka, model: ModelVersionRegistered, engine,
                 worker_id: str | None = None) -> None:
        self.settings = settings
        self.kafka = kafka
        self.model = model
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:8]}"
        self.incarnation = uuid.uuid4().hex  # this process: a restart under the same id is another incarnation
        self.engine = engine
        self.block_size = engine.config.block_size
        self.total_blocks = engine.stats().num_blocks_total
        # engine request id of choice 0 -> attempt, from the engine's reservation of room for it until `drop`
        self.attempts: dict[str, Attempt] = {}
        self.outputs: asyncio.Queue[list[RequestOutput]] = asyncio.Queue()
        # No linger: a step's records are sent together once the writer has handled the step's outputs (it does
        # not yield meanwhile). aiokafka lingers each partition's batch from its own first record and sends one
        # request per broker at a time, so a 2 ms linger split one step over 2-3 requests, each one more fetch
        # answered in every gateway and projector (`bench efficiency`, `kafka_requests_per_s`).
        self.producer = make_producer(kafka, client_id=self.worker_id, linger_ms=0)
        self.consumer = make_consumer(kafka, client_id=self.worker_id, auto_offset_reset="latest")
        self.dispatch_read = ReadThrough()  # how far this worker's orders are read (heartbeats carry it)
        self.waits = WaitCalibration()  # how wrong the controller's wait predictions were here (heartbeats)
        self.draining = False
        self.stale_commands = 0
        self.self_fenced: dict[str, int] = {}  # generation id -> epoch, until the controller cancels it
        self.last_heartbeat_ok = time.monotonic()
        self.heartbeat_stamped_at = 0.0  # set by the heartbeat thread as it stamps each heartbeat
        self._fence_said_after: float | None = None  # the last acknowledgement before the lease lost last
        self.ready = asyncio.Event()
        self.stopped = asyncio.Event()
        self._thread: EngineThread | None = None
        self.beats: HeartbeatThread | None = None
        self._finishing: set[asyncio.Task] = set()
        self._reports: set[asyncio.Task] = set()  # watermarks waiting for their stream events' acknowledgements
        self._buffered = asyncio.Event()  # some attempt holds tokens not yet in a stream event
        self.waiting = WaitingQueue()  # accepted attempts waiting for KV room
        self._failure: BaseException | None = None
        self.metrics = WorkerMetrics(lambda: self._thread.stats if self._thread else None,
                                     lambda: self.reserved_blocks, lambda: self.block_size,
                                     lambda: self._thread.timing if self._thread else None)
        self.http = RoleServer("worker", self.metrics.registry, self.readiness, settings.metrics_host,
                               settings.worker_metrics_port)

    def readiness(self) -> Readiness:
        """Ready: model loaded, engine thread running, heartbeats acknowledged within a lease, not draining."""
        thread = self._thread
        return Readiness({"model_loaded": self.total_blocks > 0,
                          "engine_running": thread is not None and thread.alive,
                          "heartbeating": self.ready.is_set() and (
                              time.monotonic() - self.last_heartbeat_ok) * 1000 < self.settings.lease_ms,
                          "accepting": not self.draining})

    def heartbeat(self, alive: bool = True) -> WorkerHeartbeat:
        """What the controller routes by and counts this worker's lease from: capacity, load, rate, and every
        attempt held or given up."""
        thread = self._thread
        unstarted = [a.start for a in self.attempts.values() if not a.started_output] + list(self.waiting)
        settings = self.settings
        return WorkerHeartbeat(worker_id=self.worker_id, model_versions=(self.model.model_version,),
                               total_blocks=self.total_blocks, free_blocks=self.free_blocks,
                               block_size=self.block_size, running=len(self.attempts) + len(self.waiting),
                               queued_tokens=sum(len(o.input_token_ids) for o in unstarted),
                               batch_queued_tokens=sum(len(o.input_token_ids) for o in unstarted if o.tier == "batch"),
                               draining=self.draining, lease_ms=settings.lease_ms,
                               alive=alive and (thread is None or thread.alive),
                               stale_commands=self.stale_commands, plane=settings.controller_group,
                               fenced=tuple(f"{g}:{e}" for g, e in sorted(self.self_fenced.items())),
                               reservation=self.engine.config.reservation,
                               headroom_tokens=settings.worker_headroom_tokens if self.optimistic else 0,
                               tokens_per_s=thread.tokens_per_s if thread is not None else None,
                               prefill_step_ms=thread.prefill_step_s * 1000
                               if thread is not None and thread.prefill_step_s else None,
                               step_ms=milliseconds(thread and thread.step_s),
                               decode_step_ms=milliseconds(thread and thread.decode_step_s),
                               prefill_token_ms=milliseconds(thread and thread.prefill_token_s),
                               max_batched_tokens=self.engine.config.max_num_batched_tokens,
                               batch_step_tokens=self.engine.config.batch_step_tokens,
                               prefix_hit_share=thread.prefix_hit_share if thread is not None else None,
                               incarnation=self.incarnation, attempts=self.held(),
                               dispatch_read_through=self.read_through_at(),
                               wait_error_ms=self.waits.error_ms(time.monotonic()),
                               ttft_error_ms=self.waits.ttft_error_ms(time.monotonic()),
                               ttft_error_high_ms=self.waits.ttft_error_high_ms(time.monotonic()),
                               max_attempts=settings.worker_max_attempts)

    def held(self) -> tuple[str, ...] | None:
        """"<generation>:<epoch>" of every attempt the worker holds (running, ending, waiting for room), or None
        past MAX_LISTED_ATTEMPTS. An attempt leaves the list once its release is acknowledged (or it was given
        up, when `fenced` names it instead)."""
        listed = [f"{a.start.generation_id}:{a.start.epoch}" for a in self.attempts.values() if not a.fenced]
        listed += [f"{o.generation_id}:{o.epoch}" for o in self.waiting]
        return tuple(listed) if len(listed) <= MAX_LISTED_ATTEMPTS else None

    def read_through_at(self) -> datetime | None:
        at = self.dispatch_read.read_through(self.consumer)
        return None if at is None else datetime.fromtimestamp(at, UTC)

    def drop(self, attempt: Attempt) -> None:
        """`attempt` leaves the worker: out of `attempts` (and so of the heartbeats' list), its room back to
        the engine for waiting attempts. Only the attempt registered under its id is dropped."""
        if self.attempts.get(attempt.request_id) is not attempt:
            return
        del self.attempts[attempt.request_id]
        self.engine.release(attempt.request_id)
        attempt.end()

    # -- fencing ----------------------------------------------------------------------------
    def give_up(self, attempt: Attempt, why: str, exc: BaseException | None = None) -> None:
        """Stop a running attempt and name it in the heartbeats (`fenced`): the controller ends it Interrupted at
        its last delivered watermark and releases its budget. An attempt already ending writes its own end."""
        if attempt.fenced or attempt.finishing:
            return
        log.error("attempt given up generation=%s epoch=%d why=%s error=%s", attempt.start.generation_id,
                  attempt.start.epoch, why, type(exc).__name__ if exc else None)
        attempt.fence()
        self.self_fenced[attempt.start.generation_id] = attempt.start.epoch
        self._thread.abort(attempt.request_id)

    def abort_overdue(self, now: float) -> None:
        """Attempts past the controller's maximum run time (and a lease more, so its Interrupted normally comes
        first with its reason): given up even when the controller's cancel does not arrive."""
        limit = self.settings.max_attempt_s + self.settings.lease_ms / 1000
        for attempt in list(self.attempts.values()):
            if now - attempt.admitted_at > limit:
                self.give_up(attempt, "max-attempt-time")

    def fence_all(self) -> None:
        """No acknowledged heartbeat for a lease: the controller has given our attempts up, so stop them. Asked
        every heartbeat interval while the lease is lost; said in the log once per lost lease, and again
        whenever it stops something."""
        stopped = len(self.waiting)
        self.waiting.clear()
        for attempt in self.attempts.values():
            if not attempt.fenced:
                attempt.fence()
                self.self_fenced[attempt.start.generation_id] = attempt.start.epoch
                self.abort(attempt)
                stopped += 1
        if stopped or self._fence_said_after != self.last_heartbeat_ok:
            self._fence_said_after = self.last_heartbeat_ok
            if self.attempts or stopped:
                log.error("self-fenced worker=%s attempts=%d stopped=%d", self.worker_id, len(self.attempts),
                          stopped)
            else:  # nothing was given up: a starved start (4 CPU hogs) lapses before any attempt arrives
                log.warning("lease lapsed worker=%s holding nothing", self.worker_id)

    @property
    def drained(self) -> bool:
        """A drain has ended every attempt, queued ones and ends being written included: the worker may exit."""
        return self.draining and not self.attempts and not self._finishing and not self.waiting

    # -- lifecycle --------------------------------------------------------------------------
    async def send_heartbeat(self) -> asyncio.Future:
        """A heartbeat handed to the heartbeat thread's producer (on that thread); its acknowledgement is the
        returned future."""
        return await self.beats.send()

    async def run(self) -> None:
        await self.http.start()  # first: a taken port fails the start before anything else runs
        loop = asyncio.get_running_loop()
        self._thread = EngineThread(self.engine, lambda outs: loop.call_soon_threadsafe(self.outputs.put_nowait, outs),
                                    lambda rid, why: loop.call_soon_threadsafe(self.refuse_from_engine, rid, why),
                                    self.engine.config.tenant_weights)
        self._thread.start()
        # llguidance's view of the tokenizer (~0.5 s for 49k tokens), built off the engine thread now rather than
        # on it at the first structured request, where it would stall every stream.
        warm = loop.run_in_executor(None, lambda: self.engine.grammars.tokenizer)
        warm.add_done_callback(lambda f: f.exception() and log.warning(
            "grammar tokenizer not built error=%s", type(f.exception()).__name__))
        await self.producer.start()
        await self.consumer.start()
        partitions = await partitions_of(self.consumer, DISPATCH)
        tp = partitions[partition_for(self.worker_id, len(partitions))]
        self.consumer.assign([tp])
        await self.consumer.seek_to_end(tp)
        await self.consumer.position(tp)
        # No heartbeat before the engine's warm-up has ended: work routed to a worker still warming up waits for
        # it (beside a batch burst, the first chats waited 5.3 s), and the warm-up prices the first heartbeat.
        await asyncio.to_thread(self._thread.warmed.wait)
        if not self._thread.alive:
            await self.http.stop()
            await self.consumer.stop()
            await self.producer.stop()
            raise EngineStopped(f"the engine thread of {self.worker_id} died warming up")
        tasks = [asyncio.create_task(self._pump(), name="worker-pump"),
                 asyncio.create_task(self._read_dispatch(), name="worker-dispatch"),
                 asyncio.create_task(self._upkeep(), name="worker-upkeep")]
        if self.settings.stream_flush_ms > 0:
            tasks.append(asyncio.create_task(self._flusher(), name="worker-flush"))
        self.beats = HeartbeatThread(self, self._thread)
        heartbeats = self.beats.start()
        self.ready.set()
        log.info("worker ready worker=%s model=%s blocks=%d", self.worker_id, self.model.model_version,
                 self.total_blocks)
        try:
            # The heartbeat loop returns once a drain has finished every attempt; any loop failing stops us.
            done, _ = await asyncio.wait([*tasks, heartbeats], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in [*tasks, *self._reports]:
                task.cancel()
            await self.beats.stop()
            if self._finishing:  # ends already computed are still written
                await asyncio.wait(self._finishing, timeout=5)
            try:
                await self.producer.send_and_wait(WORKERS, value=encode(self.heartbeat(alive=False)),
                                                  key=self.worker_id.encode())
            except Exception as exc:
                log.warning("final heartbeat failed worker=%s error=%s", self.worker_id, type(exc).__name__)
            self._thread.stop()
            await self.http.stop()
            await self.consumer.stop()
            await self.producer.stop()
            self.stopped.set()


def milliseconds(seconds: float | None) -> float | None:
    """A measured duration for a heartbeat: None until measured (and for a zero, which says nothing)."""
    return seconds * 1000 if seconds else None
