"""Stream bridge: `llm.tokens` + `llm.generations` -> per-generation views that HTTP streams read.

The bridge follows both topics from where the projections in Postgres stand
(`replay.py`; from the end when built without a start), so every generation
the projections have not applied yet is in view once the bridge has caught up,
and every one admitted while it runs is seen from its first event, even when
tokens arrive before the admission reply reaches the HTTP call. A view keeps
its events until some time after the end (readers that come later get the
resume buffer from Postgres instead).

Epochs: the current epoch of a generation comes from its lifecycle; an
interrupted epoch is dead, and its late tokens are ignored.
The final event is the worker's `StreamFinished`; for ends without a worker
(interrupted, rejected, canceled before start) the bridge writes it itself
from the last recorded usage watermark, labelled "interrupted" where only the
watermark was billed.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from plumbing.kafka.clients import Kafka
from plumbing.kafka.follower import Follower, StartPositions
from schemas.envelope import Envelope
from schemas.lifecycle import (
    Admitted, AttemptStarted, CancelRequested, Canceled, Completed, Expired, Failed, Interrupted, Rejected,
    UsageReported,
)
from schemas.stream import StreamFinished, TokensEmitted
from schemas.topics import GENERATIONS, TOKENS
from schemas.values import Usage

KEEP_ENDED_S = 300.0
# A worker-ended generation's StreamFinished follows its terminal event; wait this long before writing our own.
FINAL_GRACE_S = 2.0
# An interrupted stream whose last watermark counts tokens this bridge has not read yet (llm.tokens read behind
# llm.generations, e.g. while a broker is back from an outage) waits this long for them before it ends: the
# worker sends a watermark only once the tokens it counts are on the log, so they are coming.
WATERMARK_WAIT_S = 15.0

STATUS_OF_TERMINAL = {"Completed": "completed", "Canceled": "canceled", "Interrupted": "interrupted",
                      "Expired": "expired", "Failed": "failed", "Rejected": "rejected"}
REASON_OF_TERMINAL = {"Canceled": "canceled", "Interrupted": "interrupted", "Expired": "expired",
                      "Failed": "failed", "Rejected": "rejected"}


@dataclass
class FinalEvent:
    reason: str
    usage: Usage
    usage_label: str
    seq: int


@dataclass
class GenerationView:
    generation_id: str
    tenant_id: str
    request_id: str | None = None
    model_version: str | None = None
    status: str = "admitted"
    epoch: int | None = None
    worker_id: str | None = None
    dead_epochs: set[int] = field(default_factory=set)
    cancel_requested: bool = False
    tier: str = "interactive"
    streams: dict[int, list[TokensEmitted]] = field(default_factory=dict)
    finals: dict[int, FinalEvent] = field(default_factory=dict)
    usage: dict[int, Usage] = field(default_factory=dict)
    terminal: Envelope | None = None
    terminal_at: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def current_epoch(self) -> int:
        """The lifecycle's epoch; before the lifecycle is seen (tokens can overtake it), the newest streamed."""
        if self.epoch is not None:
            return self.epoch
        return max(self.streams, default=1)

    @property
    def tokens(self) -> list[TokensEmitted]:
        return self.streams.get(self.current_epoch, [])

    @property
    def final(self) -> FinalEvent | None:
        return self.finals.get(self.current_epoch)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def covers_watermark(self) -> bool:
        """The current epoch's stream holds every token its latest usage watermark counts."""
        billed = self.usage.get(self.current_epoch, Usage()).generated_output_tokens
        return sum(len(t.token_ids) for t in self.tokens) >= billed

    @property
    def text(self) -> str:
        return "".join(t.text_delta for t in self.tokens)

    def as_status(self) -> dict:
        usage = self.usage.get(self.current_epoch, Usage())
        if self.final is not None:
            usage = self.final.usage
        return {"id": self.generation_id, "requestId": self.request_id, "model": self.model_version,
                "status": self.status, "epoch": self.epoch, "workerId": self.worker_id,
                "cancelRequested": self.cancel_requested,
                "endReason": self.final.reason if self.final else None,
                "usage": {"inputTokens": usage.processed_input_tokens, "cachedInputTokens": usage.cached_input_tokens,
                          "outputTokens": usage.generated_output_tokens}}


class StreamBridge:
    def __init__(self, kafka: Kafka, clock=time.monotonic, start: StartPositions | None = None) -> None:
        self.views: dict[str, GenerationView] = {}
        self.clock = clock
        self.follower = Follower(kafka, [TOKENS, GENERATIONS], self.on_event, start=start or "end",
                                 client_id="gateway-bridge", after_batch=self.notify_changed)
        self._changed: set[str] = set()
        self._tasks: list[asyncio.Task] = []
        self.advanced = asyncio.Event()  # replaced after every fetched batch: lookups waiting for a view wait on it

    @property
    def caught_up(self) -> bool:
        """Read every record up to the log's end at start: from now on a view is missing only for ids whose
        records are all projected (or not yet written)."""
        return self.follower.caught_up.is_set()

    async def start(self) -> None:
        await self.follower.start()
        self._tasks = [asyncio.create_task(self.follower.run(), name="bridge-follow"),
                       asyncio.create_task(self._sweep(), name="bridge-sweep")]

    @property
    def running(self) -> bool:
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.follower.stop()

    def view(self, generation_id: str) -> GenerationView | None:
        return self.views.get(generation_id)

    def knows_request(self, tenant_id: str, request_id: str) -> bool:
        """A generation of this tenant under this request id is in view (a scan: rare callers only)."""
        return any(v.request_id == request_id and v.tenant_id == tenant_id for v in self.views.values())

    def _view_for(self, event: Envelope) -> GenerationView:
        view = self.views.get(event.generation_id)
        if view is None:
            view = self.views[event.generation_id] = GenerationView(event.generation_id, event.tenant_id)
        return view

    def on_event(self, topic: str, event: Envelope) -> None:
        view = self._view_for(event)
        if isinstance(event, TokensEmitted):
            stream = view.streams.setdefault(event.epoch, [])
            if event.epoch not in view.dead_epochs and event.epoch not in view.finals:
                if not stream or event.seq > stream[-1].seq:
                    stream.append(event)
                if view.terminal is not None and view.final is None and self.caught_up and view.covers_watermark():
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
        view.status = STATUS_OF_TERMINAL[type(event).__name__]
        if isinstance(event, (Completed, Canceled, Expired, Failed)):
            view.usage[view.current_epoch] = event.usage
        elif self.caught_up and view.covers_watermark():
            self._end_without_worker(view)
        # else replaying, or the watermark counts tokens not read yet: llm.tokens may lag this topic, so the
        # stream's last seq is not known yet (the next token event or the sweep ends it)

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

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.sweep_once()

    def sweep_once(self) -> None:
        """Write the final events no worker will write (after a grace, once caught up); drop long-ended views."""
        now = self.clock()
        for gen_id, view in list(self.views.items()):
            if view.terminal_at is None or not self.caught_up:
                continue
            waited = now - view.terminal_at
            if view.final is None and waited > FINAL_GRACE_S and (view.covers_watermark() or waited > WATERMARK_WAIT_S):
                self._end_without_worker(view)
                if view.final is None:
                    name = type(view.terminal).__name__
                    self._finish_without_worker(view, REASON_OF_TERMINAL.get(name, "completed"), "final")
                view.notify()
            elif now - view.terminal_at > KEEP_ENDED_S:
                del self.views[gen_id]

    async def follow(self, generation_id: str, timeout_s: float = 600.0, after_seq: int = 0):
        """Yield ("token", TokensEmitted) in seq order after `after_seq`, then ("final", FinalEvent);
        ("timeout", None) if it stalls."""
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
