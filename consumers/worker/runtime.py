"""The worker process: one engine, its attempts, heartbeats and every event of its generations.

    llm.dispatch[partition of worker id] ─▶ StartAttempt: reserve KV or refuse ─▶ AttemptStarted
                                          ─▶ CancelAttempt(epoch) / DrainWorker
    engine thread outputs ─▶ TokensEmitted (seq from 1) and UsageReported every N tokens / T ms, each sent once
                             the TokensEmitted it counts are acknowledged (reports.py)
    end ─▶ stream acked ─▶ final UsageReported + terminal, acked ─▶ StreamFinished ─▶ ReleaseReservation
    every heartbeat interval ─▶ WorkerHeartbeat (incarnation, attempts held); no acknowledged heartbeat for
                                a lease ─▶ self-fence; an attempt past max_attempt_s + a lease ─▶ given up

Reservation is worker-side accounting over the whole block pool. Optimistic
(the default): an attempt is accepted when its prompt plus a headroom fits
what is neither reserved nor in use (less a free-block watermark); its blocks
grow with its output and, when the pool runs dry, the engine preempts by
recompute (batch first, then lowest weight, newest first). Full: prompt + max
output up front, never preempted. An attempt that does not fit yet waits here
(interactive ahead of batch) until its deadline, then ends `expired`, unbilled.
Refusals go back to the controller on `llm.commands`; one that cannot be sent
is given up in the heartbeats (`fenced`) instead, and one dispatch record that
fails never stops the dispatch loop. So is an attempt whose AttemptStarted,
stream event or watermark was not delivered (sends.py), and one whose end
could not be written: the controller then ends it Interrupted and releases
its budget. Heartbeats list every attempt held under this process's
incarnation id, so a restart under the same worker id loses nothing silently.

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


from plumbing.kafka.clients import Kafka, make_consumer, make_producer
from plumbing.kafka.clients import partitions_of
from plumbing.kafka.follower import ReadThrough, partition_for
from consumers.worker.attempts import (
    FINISHES, Attempt, attempt_id_of, blocks_for, choice_of, engine_requests, monotonic_of, refusal, terminal_event,
)
from consumers.worker.engine_setup import engine_config, load_engine  # noqa: F401 -- callers import them here
from consumers.worker.engine_thread import EngineThread
from consumers.worker.heartbeats import heartbeat_loop, heartbeat_of, upkeep_loop
from consumers.worker.measure import observe_output
from consumers.worker.sends import acked, watched
from consumers.worker.waiting import WaitingQueue
from engine.request import FinishReason, RequestOutput
from plumbing.settings import Settings
from plumbing.telemetry.metrics import WorkerMetrics
from plumbing.telemetry.server import Readiness, RoleServer
from schemas.codec import DecodeError, decode, encode, record_headers, record_key
from schemas.commands import ReleaseReservation
from schemas.dispatch import CancelAttempt, DrainWorker, StartAttempt
from schemas.lifecycle import AttemptStarted, Canceled, Expired, UsageReported
from schemas.registry_events import ModelVersionRegistered, WorkerHeartbeat
from schemas.stream import StreamFinished, TokensEmitted
from schemas.topics import COMMANDS, DISPATCH, GENERATIONS, TOKENS, WORKERS

log = logging.getLogger(__name__)


class Worker:
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
        self.attempts: dict[str, Attempt] = {}  # engine request id of choice 0 -> attempt
        self.outputs: asyncio.Queue[list[RequestOutput]] = asyncio.Queue()
        self.producer = make_producer(kafka, client_id=self.worker_id)
        self.consumer = make_consumer(kafka, client_id=self.worker_id, auto_offset_reset="latest")
        self.dispatch_read = ReadThrough()  # how far this worker's orders are read (heartbeats carry it)
        self.draining = False
        self.stale_commands = 0
        self.self_fenced: dict[str, int] = {}  # generation id -> epoch, until the controller cancels it
        self.last_heartbeat_ok = time.monotonic()
        self.ready = asyncio.Event()
        self.stopped = asyncio.Event()
        self._thread: EngineThread | None = None
        self._finishing: set[asyncio.Task] = set()
        self._reports: set[asyncio.Task] = set()  # watermarks waiting for their stream events' acknowledgements
        self._buffered = asyncio.Event()  # some attempt holds tokens not yet in a stream event
        self.waiting = WaitingQueue()  # accepted attempts waiting for KV room
        self._failure: BaseException | None = None
        self.metrics = WorkerMetrics(lambda: self._thread.stats if self._thread else None,
                                     lambda: self.reserved_blocks, lambda: self.block_size)
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

    # -- capacity ------------------------------------------------------------------------
    @property
    def reserved_blocks(self) -> int:
        return sum(a.reserved_blocks for a in self.attempts.values())

    @property
    def watermark_blocks(self) -> int:
        return int(self.total_blocks * self.settings.worker_free_block_watermark) if self.optimistic else 0

    @property
    def optimistic(self) -> bool:
        return self.engine.config.reservation == "optimistic"

    @property
    def free_blocks(self) -> int:
        """Blocks a new attempt may reserve: neither reserved nor in use by growing sequences, less the watermark."""
        used = self._thread.stats.num_blocks_used if self._thread is not None else 0
        return max(0, self.total_blocks - self.watermark_blocks - max(self.reserved_blocks, used))

    def blocks_needed(self, order: StartAttempt) -> int:
        """What accepting `order` reserves: prompt + headroom (optimistic) or prompt + max output (full)."""
        output = order.max_output_tokens
        if self.optimistic:
            output = min(output, self.settings.worker_headroom_tokens)
        return blocks_for(len(order.input_token_ids) + output * order.sampling.n, self.block_size)

    def heartbeat(self, alive: bool = True) -> WorkerHeartbeat:
        return heartbeat_of(self, alive)

    # -- publishing ------------------------------------------------------------------------
    async def send(self, topic: str, event) -> asyncio.Future:
        return await self.producer.send(topic, value=encode(event), key=record_key(topic, event),
                                        headers=record_headers(event))

    async def send_for(self, attempt: Attempt, topic: str, event) -> asyncio.Future | None:
        """A record of a running attempt, watched: if it is not delivered, the attempt is given up."""
        return await watched(self.send, topic, event,
                             lambda exc: self.give_up(attempt, f"undelivered {event.type}", exc))

    async def report_usage(self, attempt: Attempt, now: float) -> None:
        """A watermark of what the stream has carried, sent once those stream events are on the log (reports.py)."""
        await self.flush(attempt, now)
        report = UsageReported(**attempt.scoped, report_seq=attempt.next_report(now), usage=attempt.usage)

        async def send() -> None:
            if not attempt.fenced:  # given up meanwhile: nothing more is published for it
                await self.send_for(attempt, GENERATIONS, report)

        await attempt.deliveries.report(send, self._reports)

    def give_up(self, attempt: Attempt, why: str, exc: BaseException | None = None) -> None:
        """Stop a running attempt and name it in the heartbeats (`fenced`): the controller ends it Interrupted at
        its last delivered watermark and releases its budget. An attempt already ending writes its own end."""
        if attempt.fenced or attempt.finishing:
            return
        log.error("attempt given up generation=%s epoch=%d why=%s error=%s", attempt.start.generation_id,
                  attempt.start.epoch, why, type(exc).__name__ if exc else None)
        attempt.fenced = True
        self.self_fenced[attempt.start.generation_id] = attempt.start.epoch
        self._thread.abort(attempt.request_id)

    # -- dispatch ----------------------------------------------------------------------------
    async def on_start(self, order: StartAttempt, accepted: bool = False) -> None:
        """Reserve and run, queue (batch tier), or refuse. `accepted`: already queued here, a drain keeps it."""
        request_id = f"{order.generation_id}#{order.epoch}"
        if request_id in self.attempts:
            return  # a redelivered order for an attempt already running here
        need = self.blocks_needed(order)
        if self.waiting.find(order.generation_id, order.epoch) is not None:
            return
        if order.deadline_at <= datetime.now(UTC):
            await self.end_unstarted(order, "expired")  # arrived (or was queued) past the time it had to start
            return
        reason = "draining" if self.draining and not accepted else ("kv-full" if need > self.free_blocks else None)
        if reason == "kv-full" and need <= self.total_blocks - self.watermark_blocks:
            # Routed here on the controller's predicted wait: it starts when running work frees room.
            self.waiting.add(order)
            log.info("attempt queued generation=%s epoch=%d tier=%s need_blocks=%d free_blocks=%d waiting=%d",
                     order.generation_id, order.epoch, order.tier, need, self.free_blocks, len(self.waiting))
            return
        requests = []
        if reason is None:
            remaining_s = (order.deadline_at - datetime.now(UTC)).total_seconds()
            try:
                requests = engine_requests(order, request_id, time.monotonic() + remaining_s)
            except ValueError:  # values the gateway refuses, arriving through Kafka anyway
                reason = "invalid-sampling"
        if reason is not None:
            self.metrics.refused.labels(reason=reason).inc()
            log.info("attempt refused generation=%s epoch=%d reason=%s need_blocks=%d free_blocks=%d",
                     order.generation_id, order.epoch, reason, need, self.free_blocks)
            await self.refuse(order, reason)
            return
        attempt = Attempt(order, need, admitted_at=monotonic_of(order.occurred_at), unstarted=requests[1:])
        self.attempts[request_id] = attempt
        # Watched, not awaited: the projection's attempts table and billing need it, the first token does not.
        await self.send_for(attempt, GENERATIONS, AttemptStarted(**attempt.scoped, worker_id=self.worker_id))
        if attempt.fenced:  # the send failed at once: given up before it ran
            self.attempts.pop(request_id, None)
            return
        self._thread.add(requests[0], order.weight)
        log.info("attempt started generation=%s epoch=%d input_tokens=%d reserved_blocks=%d",
                 order.generation_id, order.epoch, len(order.input_token_ids), need)

    async def start_waiting(self) -> None:
        """End queued attempts whose deadline passed (all at once: their sends share produce requests), then
        start them in queue order while they fit."""
        expired = self.waiting.take_expired(datetime.now(UTC))
        if expired:
            await asyncio.gather(*(self.end_unstarted(order, "expired") for order in expired))
        while self.waiting.head is not None and self.blocks_needed(self.waiting.head) <= self.free_blocks:
            await self.on_start(self.waiting.pop_head(), accepted=True)

    async def end_unstarted(self, order: StartAttempt, reason: str) -> None:
        """End an attempt that never reached the engine: terminal event, final stream event, release. If that
        cannot be written, it is given up in the heartbeats (`fenced`) for the controller to end."""
        scoped = {"tenant_id": order.tenant_id, "generation_id": order.generation_id, "epoch": order.epoch}
        terminal = Expired(**scoped) if reason == "expired" else Canceled(**scoped)
        try:
            await acked(self.send, GENERATIONS, terminal)
            await acked(self.send, TOKENS, StreamFinished(**scoped, seq=1, reason=reason, usage=terminal.usage))
            await acked(self.send, COMMANDS, ReleaseReservation(**scoped, used_tokens=0, end_reason=reason,
                                                                plane=self.settings.controller_group))
        except Exception as exc:
            log.error("queued attempt end not written generation=%s epoch=%d reason=%s error=%s",
                      order.generation_id, order.epoch, reason, type(exc).__name__)
            self.self_fenced[order.generation_id] = order.epoch
            return
        log.info("queued attempt ended generation=%s epoch=%d reason=%s", order.generation_id, order.epoch, reason)

    def find(self, generation_id: str) -> Attempt | None:
        return next((a for a in self.attempts.values() if a.start.generation_id == generation_id), None)

    async def on_cancel(self, order: CancelAttempt) -> None:
        if self.self_fenced.get(order.generation_id) == order.epoch:
            del self.self_fenced[order.generation_id]  # the controller ended it: no need to say so any more
        queued = self.waiting.take(order.generation_id, order.epoch)
        if queued is not None:
            if not order.after_interruption:
                await self.end_unstarted(queued, "canceled")
            return
        attempt = self.find(order.generation_id)
        if attempt is None or attempt.start.epoch != order.epoch:
            self.stale_commands += 1
            log.warning("stale cancel ignored generation=%s epoch=%d running_epoch=%s", order.generation_id,
                        order.epoch, attempt.start.epoch if attempt else None)
            return
        attempt.cancel_ordered_at = monotonic_of(order.occurred_at)
        if order.after_interruption:
            attempt.fenced = True  # the controller already ended this epoch as Interrupted
        self.abort(attempt)

    def abort(self, attempt: Attempt) -> None:
        """Stop every choice of `attempt`: those running at the next step boundary, those not started now."""
        attempt.end_unstarted(FinishReason.CANCELLED)
        for request_id in attempt.engine_ids:
            self._thread.abort(request_id)

    async def on_dispatch(self, event) -> None:
        if getattr(event, "worker_id", None) != self.worker_id:
            return
        if isinstance(event, StartAttempt):
            await self.on_start(event)
        elif isinstance(event, CancelAttempt):
            await self.on_cancel(event)
        elif isinstance(event, DrainWorker):
            log.info("draining worker=%s running=%d", self.worker_id, len(self.attempts))
            self.draining = True
            await acked(self.send, WORKERS, self.heartbeat())

    async def refuse(self, order: StartAttempt, reason: str) -> None:
        """Hand the attempt back to the controller. If that cannot be sent, give it up in the heartbeats
        (`fenced`), so the controller ends it rather than wait on it forever."""
        try:
            await acked(self.send, COMMANDS, refusal(order, self.worker_id, reason, self.settings.controller_group))
        except Exception as exc:
            log.error("refusal not sent generation=%s epoch=%d error=%s", order.generation_id, order.epoch,
                      type(exc).__name__)
            self.self_fenced[order.generation_id] = order.epoch

    def refuse_from_engine(self, request_id: str, reason: str) -> None:
        choice = choice_of(request_id)
        if choice > 0:  # its first choice is running: this one fails alone, like a failed step
            attempt = self.attempts.get(attempt_id_of(request_id))
            if attempt is not None:
                attempt.choices[choice].ended = FinishReason.FAILED
                attempt.choices[choice].pending_end = FINISHES[FinishReason.FAILED][2]
                log.warning("choice refused by the engine generation=%s choice=%d reason=%s",
                            attempt.start.generation_id, choice, reason)
                if attempt.ended and not attempt.finishing and not attempt.fenced:
                    attempt.finishing = True
                    task = asyncio.get_running_loop().create_task(self.finish(attempt))
                    self._finishing.add(task)
                    task.add_done_callback(self._finished)
            return
        attempt = self.attempts.pop(request_id, None)
        if attempt is not None:
            self.metrics.refused.labels(reason="engine").inc()
            task = asyncio.get_running_loop().create_task(self.refuse(attempt.start, reason))
            self._finishing.add(task)  # kept (and awaited at shutdown) like an end
            task.add_done_callback(self._finishing.discard)

    # -- engine outputs ------------------------------------------------------------------------
    async def on_output(self, output: RequestOutput) -> None:
        attempt = self.attempts.get(attempt_id_of(output.request_id))
        if attempt is None:
            return
        choice = choice_of(output.request_id)
        observe_output(self.metrics, attempt, output, time.monotonic())
        attempt.observe(output, choice)
        if attempt.unstarted and choice == 0:
            self.start_choices(attempt, output)
        if attempt.fenced:
            if attempt.ended:
                self.attempts.pop(attempt.request_id, None)
            return
        if output.new_token_ids or output.text_delta or output.prompt_logprobs is not None or output.finished:
            attempt.buffer(output, choice)
            self._buffered.set()
        now = time.monotonic()
        if attempt.ended and not attempt.finishing:
            await self.flush(attempt, now)
            # The end waits for acknowledgements; other attempts' tokens must not wait behind it.
            attempt.finishing = True
            task = asyncio.create_task(self.finish(attempt))
            self._finishing.add(task)
            task.add_done_callback(self._finished)
            return
        if output.finished:
            await self.flush(attempt, now)  # a choice's end goes out with its last tokens
        if attempt.seq == 0 or (now - attempt.flushed_at) * 1000 >= self.settings.stream_flush_ms:
            await self.flush(attempt, now)  # the first token goes out at once: it is the TTFT
        if attempt.report_due(self.settings.usage_report_tokens, self.settings.usage_report_ms, now):
            await self.report_usage(attempt, now)

    async def flush(self, attempt: Attempt, now: float) -> None:
        """One stream event for the tokens buffered since the last one."""
        if attempt.has_pending:
            for fields in attempt.take_pending(now):
                attempt.deliveries.add(await self.send_for(attempt, TOKENS, TokensEmitted(
                    **attempt.scoped, seq=attempt.next_seq(), **fields)))

    async def _flusher(self) -> None:
        """Buffered tokens of a stream that produced nothing new for a while still go out."""
        interval = max(self.settings.stream_flush_ms, 1) / 1000
        while True:
            await self._buffered.wait()  # an idle worker does not wake every interval
            await asyncio.sleep(interval)
            now = time.monotonic()
            waiting = False
            for attempt in list(self.attempts.values()):
                if attempt.fenced or attempt.finishing or not attempt.has_pending:
                    continue
                if now - attempt.flushed_at >= interval:
                    await self.flush(attempt, now)
                else:
                    waiting = True
            if not waiting:
                self._buffered.clear()

    def start_choices(self, attempt: Attempt, first: RequestOutput) -> None:
        """Choices 1.. once choice 0 has run the prompt (its full blocks are in the prefix cache now), or ended
        with it when choice 0 ended without output of its own (canceled, failed)."""
        if first.finish_reason in (FinishReason.CANCELLED, FinishReason.FAILED, FinishReason.EXPIRED) \
                or attempt.fenced:
            attempt.end_unstarted(first.finish_reason or FinishReason.CANCELLED)
            return
        for request in attempt.unstarted:
            self._thread.add(request, attempt.start.weight)
        attempt.unstarted = []

    async def finish(self, attempt: Attempt) -> None:
        """Final watermark and terminal event acknowledged, then the final stream event, then the release;
        only then does the attempt leave the heartbeats' list and its room go to waiting attempts. If any of
        it cannot be written, the attempt is given up (`fenced`): the controller ends it and releases."""
        await self.flush(attempt, time.monotonic())  # a choice that ended without output still says so
        kind, finish_reason, end_reason = FINISHES[attempt.end_reason()]
        usage = attempt.usage
        watermark = UsageReported(**attempt.scoped, report_seq=attempt.next_report(time.monotonic()), usage=usage)
        terminal = terminal_event(kind, attempt.scoped, finish_reason, usage)
        try:
            await attempt.deliveries.settled()  # the end bills the whole stream: all of it on the log first
            await asyncio.gather(*[await self.send(GENERATIONS, watermark), await self.send(GENERATIONS, terminal)])
            await acked(self.send, TOKENS, StreamFinished(**attempt.scoped, seq=attempt.next_seq(), reason=end_reason,
                                                          usage=usage))
            await acked(self.send, COMMANDS, ReleaseReservation(
                **attempt.scoped, used_tokens=attempt.used_tokens, end_reason=end_reason,
                plane=self.settings.controller_group))
        except Exception as exc:
            log.error("attempt end not written generation=%s epoch=%d reason=%s error=%s",
                      attempt.start.generation_id, attempt.start.epoch, end_reason, type(exc).__name__)
            self.self_fenced[attempt.start.generation_id] = attempt.start.epoch
        else:
            log.info("attempt ended generation=%s epoch=%d reason=%s output_tokens=%d", attempt.start.generation_id,
                     attempt.start.epoch, end_reason, usage.generated_output_tokens)
        finally:
            self.attempts.pop(attempt.request_id, None)
        await self.start_waiting()

    def _finished(self, task: asyncio.Task) -> None:
        self._finishing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("attempt end failed error=%s", type(task.exception()).__name__)
            self._failure = task.exception()

    # -- loops ------------------------------------------------------------------------------------
    async def _pump(self) -> None:
        while True:
            if self._failure is not None:
                raise self._failure
            for output in await self.outputs.get():
                await self.on_output(output)

    async def _read_dispatch(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    try:
                        event = decode(DISPATCH, record.value)
                    except DecodeError as exc:
                        log.warning("undecodable dispatch offset=%d error=%s", record.offset, type(exc).__name__)
                        continue
                    try:
                        await self.on_dispatch(event)
                    except Exception as exc:  # one order's failure (a send the broker refused) stops no other
                        log.error("dispatch failed type=%s offset=%d error=%s", event.type, record.offset,
                                  type(exc).__name__)
            # After the orders are applied: a heartbeat saying "read through T" lists every order written before T.
            await self.dispatch_read.note(self.consumer)

    def abort_overdue(self, now: float) -> None:
        """Attempts past the controller's maximum run time (and a lease more, so its Interrupted normally comes
        first with its reason): given up even when the controller's cancel does not arrive."""
        limit = self.settings.max_attempt_s + self.settings.lease_ms / 1000
        for attempt in list(self.attempts.values()):
            if now - attempt.admitted_at > limit:
                self.give_up(attempt, "max-attempt-time")

    def fence_all(self) -> None:
        """No acknowledged heartbeat for a lease: the controller has given our attempts up, so stop them."""
        self.waiting.clear()
        for attempt in self.attempts.values():
            if not attempt.fenced:
                attempt.fenced = True
                self.self_fenced[attempt.start.generation_id] = attempt.start.epoch
                self.abort(attempt)
        log.error("self-fenced worker=%s attempts=%d", self.worker_id, len(self.attempts))

    @property
    def has_ends_in_flight(self) -> bool:
        return bool(self._finishing)

    async def send_heartbeat(self) -> asyncio.Future:
        """The heartbeat handed to the producer; its acknowledgement is the returned future."""
        return await self.send(WORKERS, self.heartbeat())

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
        tasks = [asyncio.create_task(self._pump(), name="worker-pump"),
                 asyncio.create_task(self._read_dispatch(), name="worker-dispatch"),
                 asyncio.create_task(upkeep_loop(self), name="worker-upkeep")]
        if self.settings.stream_flush_ms > 0:
            tasks.append(asyncio.create_task(self._flusher(), name="worker-flush"))
        heartbeats = asyncio.create_task(heartbeat_loop(self), name="worker-heartbeat")
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
            heartbeats.cancel()
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
