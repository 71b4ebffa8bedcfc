"""What a running attempt's engine outputs become on the log, each record sent once:

    engine thread outputs ─▶ TokensEmitted (seq from 1) and UsageReported every N tokens / T ms, each sent once
                             the TokensEmitted it counts are acknowledged (reports.py)
    end ─▶ stream acked ─▶ final UsageReported + terminal, acked ─▶ StreamFinished ─▶ ReleaseReservation

An attempt whose stream event or watermark was not delivered is given up
(sends.py), and so is one whose end could not be written: the controller then
ends it Interrupted and releases its budget.
"""
from __future__ import annotations

import asyncio
import logging
import time

from consumers.worker.attempts import FINISHES, Attempt, attempt_id_of, choice_of, terminal_event
from consumers.worker.measure import observe_output
from consumers.worker.sends import acked, watched
from engine.request import FinishReason, RequestOutput
from schemas.codec import encode, record_headers, record_key
from schemas.commands import ReleaseReservation
from schemas.lifecycle import UsageReported
from schemas.stream import StreamFinished, TokensEmitted
from schemas.topics import COMMANDS, GENERATIONS, TOKENS

log = logging.getLogger(__name__)


class AttemptWriter:
    """Part of `Worker` (runtime.py), on its state: the `producer`, `attempts`, the engine's `outputs`, the
    ends in flight (`_finishing`), watermarks waiting (`_reports`) and tokens buffered (`_buffered`).

    Every record of the worker goes through `send`: a test double of the broker replaces that one method."""

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

    async def on_output(self, output: RequestOutput) -> None:
        attempt = self.attempts.get(attempt_id_of(output.request_id))
        if attempt is None:
            return
        choice = choice_of(output.request_id)
        observe_output(self.metrics, attempt, output, time.monotonic(), self.waits)
        attempt.observe(output, choice)
        if attempt.unstarted and choice == 0:
            self.start_choices(attempt, output)
        if attempt.fenced:
            if attempt.choices_ended:
                self.drop(attempt)
            return
        if output.new_token_ids or output.text_delta or output.prompt_logprobs is not None or output.finished:
            attempt.buffer(output, choice)
            self._buffered.set()
        now = time.monotonic()
        if attempt.choices_ended and not attempt.finishing:
            await self.flush(attempt, now)
            # The end waits for acknowledgements; other attempts' tokens must not wait behind it.
            self.start_finishing(attempt)
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

    def start_finishing(self, attempt: Attempt) -> None:
        """Write the end of an attempt whose every choice ended, in a task kept (and awaited at shutdown)."""
        attempt.begin_finishing()
        task = asyncio.get_running_loop().create_task(self.finish(attempt))
        self._finishing.add(task)
        task.add_done_callback(self._finished)

    async def finish(self, attempt: Attempt) -> None:
        """Final watermark and terminal event acknowledged, then the release, then the final stream event: a
        client that has read its stream's end and posts again is decided after the release (both on its
        tenant's commands partition), so a tenant at its concurrency limit is not refused for a slot it no
        longer holds. Only then does the attempt leave the heartbeats' list and its room go to waiting
        attempts. If any of it cannot be written, the attempt is given up (`fenced`): the controller ends it
        and releases (a final stream event no worker wrote, the gateway writes after a grace)."""
        await self.flush(attempt, time.monotonic())  # a choice that ended without output still says so
        kind, finish_reason, end_reason = FINISHES[attempt.end_reason()]
        usage = attempt.usage
        watermark = UsageReported(**attempt.scoped, report_seq=attempt.next_report(time.monotonic()), usage=usage)
        terminal = terminal_event(kind, attempt.scoped, finish_reason, usage)
        try:
            await attempt.deliveries.settled()  # the end bills the whole stream: all of it on the log first
            await asyncio.gather(*[await self.send(GENERATIONS, watermark), await self.send(GENERATIONS, terminal)])
            await acked(self.send, COMMANDS, ReleaseReservation(
                **attempt.scoped, used_tokens=attempt.used_tokens, end_reason=end_reason,
                plane=self.settings.controller_group))
            await acked(self.send, TOKENS, StreamFinished(**attempt.scoped, seq=attempt.next_seq(), reason=end_reason,
                                                          usage=usage))
        except Exception as exc:
            log.error("attempt end not written generation=%s epoch=%d reason=%s error=%s",
                      attempt.start.generation_id, attempt.start.epoch, end_reason, type(exc).__name__)
            self.self_fenced[attempt.start.generation_id] = attempt.start.epoch
        else:
            log.info("attempt ended generation=%s epoch=%d reason=%s output_tokens=%d", attempt.start.generation_id,
                     attempt.start.epoch, end_reason, usage.generated_output_tokens)
        finally:
            self.drop(attempt)
        await self.start_waiting()

    def _finished(self, task: asyncio.Task) -> None:
        self._finishing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("attempt end failed error=%s", type(task.exception()).__name__)
            self._failure = task.exception()

    async def _pump(self) -> None:
        while True:
            if self._failure is not None:
                raise self._failure
            for output in await self.outputs.get():
                await self.on_output(output)
