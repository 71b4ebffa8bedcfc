"""The worker's dispatch orders, read from its partition of `llm.dispatch`:

    StartAttempt ─▶ room from the engine (engine.reserve) and run ─▶ AttemptStarted
                 ─▶ or wait here for room (interactive ahead of batch) until its deadline, then `expired`, unbilled
                 ─▶ or refuse (AttemptRefused on `llm.commands`)
    CancelAttempt(epoch) ─▶ abort at the next step boundary;  DrainWorker ─▶ accept nothing new

A refusal that cannot be sent is given up in the heartbeats (`fenced`)
instead, and so is an attempt whose AttemptStarted was not delivered; one
dispatch record that fails never stops the dispatch loop.
"""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from aiokafka import ConsumerRecord

from consumers.worker.attempts import (
    FINISHES, Attempt, attempt_id_of, choice_of, engine_requests, monotonic_of, refusal,
)
from consumers.worker.capacity import attempt_id
from consumers.worker.sends import acked
from engine.request import FinishReason
from engine.reservations import Reservation
from schemas.codec import DecodeError, decode
from schemas.commands import ReleaseReservation
from schemas.dispatch import CancelAttempt, DrainWorker, StartAttempt
from schemas.lifecycle import AttemptStarted, Canceled, Expired
from schemas.stream import StreamFinished
from schemas.topics import COMMANDS, DISPATCH, GENERATIONS, TOKENS, WORKERS

log = logging.getLogger(__name__)


class DispatchOrders:
    """Part of `Worker` (runtime.py), on its state: the `consumer` of its dispatch partition, `attempts`,
    the `waiting` queue, `draining`, `stale_commands` and `self_fenced`; room comes from its KV accounting
    (capacity.py), which asks the engine."""

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

    async def on_start(self, order: StartAttempt, reservation: Reservation | None = None) -> None:
        """Reserve room and run, queue for room, or refuse. `reservation`: the room the engine gave an order queued
        here when it reached the head of the queue (a drain keeps such an order)."""
        request_id = attempt_id(order)
        if request_id in self.attempts or (reservation is None and self.waiting.find(order.generation_id,
                                                                                     order.epoch) is not None):
            return  # a redelivered order for an attempt already running or queued here
        if order.deadline_at <= datetime.now(UTC):
            if reservation is not None:
                self.engine.release(request_id)
            await self.end_unstarted(order, "expired")  # arrived (or was queued) past the time it had to start
            return
        reason = "draining" if self.draining and reservation is None else None
        if reason is None and reservation is None:
            reservation = self.reserve(order)
            if reservation is None and self.could_ever_fit(order):
                # Routed here on the controller's predicted wait: it starts when running work frees room.
                self.waiting.add(order)
                log.info("attempt queued generation=%s epoch=%d tier=%s need_blocks=%d free_blocks=%d waiting=%d",
                         order.generation_id, order.epoch, order.tier, self.blocks_needed(order), self.free_blocks,
                         len(self.waiting))
                return
            reason = "kv-full" if reservation is None else None
        requests = []
        if reason is None:
            remaining_s = (order.deadline_at - datetime.now(UTC)).total_seconds()
            try:
                requests = engine_requests(order, request_id, time.monotonic() + remaining_s)
            except ValueError:  # values the gateway refuses, arriving through Kafka anyway
                reason = "invalid-sampling"
        if reason is not None:
            if reservation is not None:
                self.engine.release(request_id)
            self.metrics.refused.labels(reason=reason).inc()
            log.info("attempt refused generation=%s epoch=%d reason=%s need_blocks=%d free_blocks=%d",
                     order.generation_id, order.epoch, reason, self.blocks_needed(order), self.free_blocks)
            await self.refuse(order, reason)
            return
        attempt = Attempt(order, reservation, admitted_at=monotonic_of(order.occurred_at), unstarted=requests[1:])
        self.attempts[request_id] = attempt
        # Watched, not awaited: the projection's attempts table and billing need it, the first token does not.
        await self.send_for(attempt, GENERATIONS, AttemptStarted(**attempt.scoped, worker_id=self.worker_id))
        if attempt.fenced:  # the send failed at once: given up before it ran
            self.drop(attempt)
            return
        self._thread.add(requests[0], order.weight)
        log.info("attempt started generation=%s epoch=%d input_tokens=%d reserved_blocks=%d",
                 order.generation_id, order.epoch, len(order.input_token_ids), reservation.num_blocks)

    async def start_waiting(self) -> None:
        """End queued attempts whose deadline passed (all at once: their sends share produce requests), then
        start them in queue order while the engine gives the head room."""
        expired = self.waiting.take_expired(datetime.now(UTC))
        if expired:
            await asyncio.gather(*(self.end_unstarted(order, "expired") for order in expired))
        while self.waiting.head is not None:
            reservation = self.reserve(self.waiting.head)
            if reservation is None:
                return
            await self.on_start(self.waiting.pop_head(), reservation)

    async def end_unstarted(self, order: StartAttempt, reason: str) -> None:
        """End an attempt that never reached the engine: terminal event, release, final stream event. If that
        cannot be written, it is given up in the heartbeats (`fenced`) for the controller to end."""
        scoped = {"tenant_id": order.tenant_id, "generation_id": order.generation_id, "epoch": order.epoch}
        terminal = Expired(**scoped) if reason == "expired" else Canceled(**scoped)
        try:
            await acked(self.send, GENERATIONS, terminal)
            await acked(self.send, COMMANDS, ReleaseReservation(**scoped, used_tokens=0, end_reason=reason,
                                                                plane=self.settings.controller_group))
            await acked(self.send, TOKENS, StreamFinished(**scoped, seq=1, reason=reason, usage=terminal.usage))
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
        if order.after_interruption and not attempt.fenced:
            attempt.fence()  # the controller already ended this epoch as Interrupted
        self.abort(attempt)

    def abort(self, attempt: Attempt) -> None:
        """Stop every choice of `attempt`: those running at the next step boundary, those not started now."""
        attempt.end_unstarted(FinishReason.CANCELLED)
        for request_id in attempt.engine_ids:
            self._thread.abort(request_id)

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
                if attempt.choices_ended and not attempt.finishing and not attempt.fenced:
                    self.start_finishing(attempt)
            return
        attempt = self.attempts.get(request_id)
        if attempt is not None:
            self.drop(attempt)
            self.metrics.refused.labels(reason="engine").inc()
            task = asyncio.get_running_loop().create_task(self.refuse(attempt.start, reason))
            self._finishing.add(task)  # kept (and awaited at shutdown) like an end
            task.add_done_callback(self._finishing.discard)

    async def _read_dispatch(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    await self.on_record(record)
            # After the orders are applied: a heartbeat saying "read through T" lists every order written before T.
            await self.dispatch_read.note(self.consumer)

    async def on_record(self, record: ConsumerRecord) -> None:
        """One dispatch record: an undecodable one is skipped, and one order's failure (a send the broker
        refused) stops no other."""
        try:
            event = decode(DISPATCH, record.value)
        except DecodeError as exc:
            log.warning("undecodable dispatch offset=%d error=%s", record.offset, type(exc).__name__)
            return
        try:
            await self.on_dispatch(event)
        except Exception as exc:
            log.error("dispatch failed type=%s offset=%d error=%s", event.type, record.offset, type(exc).__name__)

    async def _upkeep(self) -> None:
        """Every heartbeat interval: give up attempts past their maximum run time, end waiting attempts whose
        deadline passed and start those that fit (deadlines pass even when nothing finishes). Beside the
        heartbeats, never in their way (heartbeats.py)."""
        interval = self.settings.heartbeat_interval_ms / 1000
        while True:
            self.abort_overdue(time.monotonic())
            if self.waiting:
                await self.start_waiting()
            await asyncio.sleep(interval)
