"""Stream bridge: `llm.tokens` + `llm.generations` -> per-generation views that HTTP streams read.

The bridge reads this gateway's share of the partitions and those of its local
subscribers (`shared_tail.py`), from where the projections in Postgres stand
(`replay.py`; from the end when built without a start). It decodes the
lifecycle of every generation in its share, and the tokens only of generations
someone here watches; a generation's first local subscriber (or waiting lookup)
reads back what was skipped before anything is served. A view keeps its events
until some time after the end (readers that come later get the resume buffer
from Postgres instead).

Epochs: the current epoch of a generation comes from its lifecycle; an
interrupted epoch is dead, and its late tokens are ignored.
The final event is the worker's `StreamFinished`; for ends without a worker
(interrupted, rejected, canceled before start) the bridge writes it itself
from the last recorded usage watermark, labelled "interrupted" where only the
watermark was billed: at once when its view read the generation from the
admission and holds the tokens that watermark counts; otherwise in the sweep,
after FINAL_GRACE_S (a view begun later may lack the watermark the seal bills,
and the tokens it counts may still be on their way).
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

from plumbing.kafka.clients import Kafka
from plumbing.kafka.follower import StartPositions
from producers.gateway.streams.generation_view import (
    FINAL_GRACE_S, KEEP_ENDED_S, REASON_OF_TERMINAL, STATUS_OF_TERMINAL, WATERMARK_WAIT_S, FinalEvent,
    GenerationView,
)
from producers.gateway.streams.shared_tail import SharedTail
from schemas.envelope import Envelope
from schemas.lifecycle import (
    Admitted, AttemptStarted, CancelRequested, Canceled, Completed, Expired, Failed, Interrupted, Rejected,
    UsageReported,
)
from schemas.stream import StreamFinished, TokensEmitted
from schemas.values import Usage

__all__ = ["FINAL_GRACE_S", "FinalEvent", "GenerationView", "StreamBridge"]


class StreamBridge:
    def __init__(self, kafka: Kafka, clock=time.monotonic, start: StartPositions | None = None,
                 group: str = "ledgerlm-gateways", share: bool = True) -> None:
        self.views: dict[str, GenerationView] = {}
        # Ended views in the order they ended, and those of them still without a final event: the sweep walks
        # these, not every view held (an idle gateway that had replayed a busy log walked thousands twice a second).
        self._ended: dict[str, GenerationView] = {}
        self._final_due: dict[str, GenerationView] = {}
        self.clock = clock
        self.tail = SharedTail(kafka, self, start, group, share)
        self._changed: set[str] = set()
        self._tasks: list[asyncio.Task] = []
        self.advanced = asyncio.Event()  # replaced after every fetched batch: lookups waiting for a view wait on it

    @property
    def caught_up(self) -> bool:
        """Read every record of its first share of partitions up to the log's end at start: from now on a view
        is missing only for ids whose records are all projected (or not yet written), or not in its share."""
        return self.tail.owned.caught_up.is_set()

    async def start(self) -> None:
        await self.tail.start()
        self._tasks = [*self.tail.tasks(), asyncio.create_task(self._sweep(), name="bridge-sweep")]
        await self.tail.first_share()

    @property
    def running(self) -> bool:
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.tail.stop()

    @asynccontextmanager
    async def attending(self, generation_id: str):
        """Keep `generation_id`'s records decoded (and the ones skipped so far read back) inside the block."""
        try:
            await self.tail.attend(generation_id)
            yield
        finally:
            self.tail.leave(generation_id)

    def view(self, generation_id: str) -> GenerationView | None:
        return self.views.get(generation_id)

    def knows_request(self, tenant_id: str, request_id: str) -> bool:
        """A generation of this tenant under this request id is in view (a scan: rare callers only)."""
        return any(v.request_id == request_id and v.tenant_id == tenant_id for v in self.views.values())

    def _view_for(self, event: Envelope, wanted: bool) -> GenerationView:
        view = self.views.get(event.generation_id)
        if view is None:
            view = self.views[event.generation_id] = GenerationView(event.generation_id, event.tenant_id,
                                                                     partial=not wanted)
        return view

    def on_event(self, topic: str, event: Envelope, wanted: bool = True) -> None:
        """Apply one record; `wanted` False for a lifecycle record of a generation whose tokens are skipped."""
        if not hasattr(event, "generation_id"):
            return  # a billing period marker (schemas/billing_periods.py): about no generation
        view = self._view_for(event, wanted)
        if isinstance(event, TokensEmitted):
            stream = view.streams.setdefault(event.epoch, [])
            if event.epoch not in view.dead_epochs and event.epoch not in view.finals:
                if not stream or event.seq > stream[-1].seq:
                    stream.append(event)
                if view.terminal is not None and view.final is None and self.ends_now(view):
                    self._end_without_worker(view)
        elif isinstance(event, StreamFinished):
            if event.epoch not in view.dead_epochs and event.epoch not in view.finals:
                view.finals[event.epoch] = FinalEvent(event.reason, event.usage, event.usage_label, event.seq)
        elif isinstance(event, Admitted):
            view.request_id, view.model_version, view.tier = event.request_id, event.model_version, event.tier
            view.epoch = max(view.epoch or 0, event.epoch or 1)
        elif isinstance(event, AttemptStarted):
            if event.epoch not in view.dead_epochs and event.epoch >= (view.epoch or 0):
                view.epoch, view.worker_id = event.epoch, event.worker_id
                if view.terminal is None:
                    view.status = "running"
        elif isinstance(event, CancelRequested):
            view.cancel_requested = True
        elif isinstance(event, UsageReported):
            known = view.usage.get(event.epoch)
            if known is None or event.usage.generated_output_tokens >= known.generated_output_tokens:
                view.usage[event.epoch] = event.usage
        elif type(event).__name__ in STATUS_OF_TERMINAL:
            self._on_terminal(view, event)
        self._changed.add(view.generation_id)

    def notify_changed(self) -> None:
        """Wake each changed view's readers once per fetched batch, not once per event."""
        for generation_id in self._changed:
            view = self.views.get(generation_id)
            if view is not None:
                view.notify()
        self._changed.clear()
        self.advanced.set()
        self.advanced = asyncio.Event()

    def _on_terminal(self, view: GenerationView, event: Envelope) -> None:
        if view.terminal is not None:
            return
        view.terminal, view.terminal_at = event, self.clock()
        self._ended[view.generation_id] = self._final_due[view.generation_id] = view
        view.status = STATUS_OF_TERMINAL[type(event).__name__]
        if isinstance(event, (Completed, Canceled, Expired, Failed)):
            view.usage[view.current_epoch] = event.usage
        elif self.ends_now(view):
            self._end_without_worker(view)
        # else replaying: llm.tokens may lag this topic, so the stream's last seq is not known yet (the sweep ends it)

    def ends_now(self, view: GenerationView) -> bool:
        """Whether an end no worker writes can be written as soon as it is read (else the sweep writes it)."""
        return self.caught_up and not view.partial and view.from_admission and view.covers_watermark()

    def _end_without_worker(self, view: GenerationView) -> None:
        """The final event of an interrupted or rejected generation, which no worker writes."""
        if isinstance(view.terminal, Interrupted):
            view.dead_epochs.add(view.terminal.epoch)
            self._finish_without_worker(view, "interrupted", "interrupted")
        elif isinstance(view.terminal, Rejected):
            self._finish_without_worker(view, "rejected", "final")

    def _finish_without_worker(self, view: GenerationView, reason: str, label: str) -> None:
        if view.final is None:
            usage = view.usage.get(view.current_epoch, Usage())
            seq = (view.tokens[-1].seq if view.tokens else 0) + 1
            view.finals[view.current_epoch] = FinalEvent(reason, usage, label, seq)

    def backfilled(self, generation_id: str, events: list[tuple[str, Envelope]]) -> None:
        """Apply what a backfill read back: the view then holds everything the projections lack."""
        tokens = [event for _topic, event in events if isinstance(event, TokensEmitted)]
        for topic, event in events:
            if not isinstance(event, TokensEmitted):
                self.on_event(topic, event)
        if tokens:
            self._view_for(tokens[0], True).merge_tokens(tokens)
        view = self.views.get(generation_id)
        if view is not None:
            view.partial = False
            if view.terminal is not None and view.final is None and self.ends_now(view):
                self._end_without_worker(view)
            self._changed.add(generation_id)
            self.notify_changed()

    def unwatched(self, generation_id: str) -> None:
        """Nobody here wants its records any more: from now on they are skipped."""
        view = self.views.get(generation_id)
        if view is not None:
            view.partial = True

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.sweep_once()
            await self.tail.release_idle()

    def sweep_once(self) -> None:
        """Write the final events no worker will write (after a grace, once caught up); drop long-ended views."""
        if not self.caught_up:
            return
        now = self.clock()
        for gen_id, view in list(self._final_due.items()):
            if view.final is not None:
                del self._final_due[gen_id]
                continue
            waited = now - view.terminal_at
            if not view.partial and waited > FINAL_GRACE_S and (view.covers_watermark() or waited > WATERMARK_WAIT_S):
                self._end_without_worker(view)
                if view.final is None:
                    name = type(view.terminal).__name__
                    self._finish_without_worker(view, REASON_OF_TERMINAL.get(name, "completed"), "final")
                view.notify()
        for gen_id, view in list(self._ended.items()):  # oldest first: stop at the first one kept for its time
            if now - view.terminal_at <= KEEP_ENDED_S:
                break
            if not self.tail.interest.wanted(gen_id):
                del self._ended[gen_id]
                self._final_due.pop(gen_id, None)
                del self.views[gen_id]

    async def follow(self, generation_id: str, timeout_s: float = 600.0, after_seq: int = 0):
        """Yield ("token", TokensEmitted) in seq order after `after_seq`, then ("final", FinalEvent);
        ("timeout", None) if it stalls."""
        async with self.attending(generation_id):
            async for item in self._follow(generation_id, timeout_s, after_seq):
                yield item

    async def _follow(self, generation_id: str, timeout_s: float, after_seq: int):
        sent = 0
        deadline = self.clock() + timeout_s
        while True:
            view = self.views.get(generation_id)
            if view is not None:
                while sent < len(view.tokens):
                    if view.tokens[sent].seq > after_seq:
                        yield "token", view.tokens[sent]
                    sent += 1
                if view.final is not None:
                    yield "final", view.final
                    return
                changed = view.changed
            else:
                changed = None
            remaining = deadline - self.clock()
            if remaining <= 0:
                yield "timeout", None
                return
            if changed is None:
                await asyncio.sleep(min(0.05, remaining))
                continue
            try:
                async with asyncio.timeout(min(remaining, 1.0)):  # no task per wait, unlike wait_for
                    await changed.wait()
            except TimeoutError:
                pass
