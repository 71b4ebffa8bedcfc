"""What the stream bridge knows of one generation: its lifecycle, streams per epoch and final event.

A view is `partial` while its records may be skipped (no local subscriber: `producers/gateway/streams/interest.py`);
the bridge writes no final event of its own for a partial view, since its last seq is not known.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from schemas.envelope import Envelope
from schemas.stream import TokensEmitted
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
    partial: bool = False

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

    def merge_tokens(self, events: list[TokensEmitted]) -> None:
        """Add events read out of order (a backfill of what was skipped): each stream stays in seq order, once."""
        for epoch in {event.epoch for event in events}:
            by_seq = {event.seq: event for event in events if event.epoch == epoch}
            by_seq.update({event.seq: event for event in self.streams.get(epoch, [])})
            self.streams[epoch] = [by_seq[seq] for seq in sorted(by_seq)]

    def covers_watermark(self) -> bool:
        """The current epoch's stream holds every token its latest usage watermark counts. Judged by the last
        event's cumulative `token_count`: a view may hold only the end of a stream whose start a client got
        from the resume buffer."""
        billed = self.usage.get(self.current_epoch, Usage()).generated_output_tokens
        tokens = self.tokens
        return (tokens[-1].token_count if tokens else 0) >= billed

    @property
    def from_admission(self) -> bool:
        """It read the lifecycle from the admission on, so its watermark is the newest one before the records it
        read. A view begun later (a guest's backfill, a partition a rebalance assigned, read from where the
        projections stand) lacks the watermarks applied before it, and may be reading llm.generations ahead
        of llm.tokens: it cannot tell which tokens an interruption's bill counts."""
        return self.request_id is not None

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

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
