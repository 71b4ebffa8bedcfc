"""One intake partition's records in flight, and how far its offset may be committed.

    offsets  10 11 12 13 14
    state    ok ok .. ok ..     committable: 12 (the next offset after the contiguous done prefix)

A record is done once its outcome is durable: the controller's decision arrived (it is written in the
controller's transaction before the reply), or the refusal to publish is ready to go in the same transaction
as the offset. Records finish out of order (one held by a Retry-After does not hold back the others' work),
but the offset never passes a record that is not done, so a crash re-reads it.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiokafka import ConsumerRecord

from schemas.dead_letter import DeadLetter
from schemas.intake import GenerationResult

Outcome = GenerationResult | DeadLetter | None  # None: admitted (its result is derived from the log)


@dataclass
class Lane:
    """Records of one partition, processed concurrently up to `window`, committed in offset order."""

    process: Callable[[ConsumerRecord], Awaitable[Outcome]]
    window: int
    next_offset: int | None = None  # the first offset not yet committed
    done: dict[int, Outcome] = field(default_factory=dict)
    tasks: dict[int, asyncio.Task] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def full(self) -> bool:
        return len(self.tasks) >= self.window

    def add(self, record: ConsumerRecord) -> None:
        if self.next_offset is None:
            self.next_offset = record.offset
        self.tasks[record.offset] = asyncio.create_task(self._run(record), name=f"intake-{record.offset}")

    async def _run(self, record: ConsumerRecord) -> None:
        outcome = await self.process(record)
        self.done[record.offset] = outcome
        del self.tasks[record.offset]
        self.wake.set()

    def take_ready(self) -> tuple[list[Outcome], int | None]:
        """Outcomes of the contiguous done prefix, and the offset to commit after them (None: nothing new).

        Offsets are not contiguous on a compacted or transactional topic, so the prefix ends at the first
        offset still in flight, not at the first missing number."""
        if self.next_offset is None or not self.done:
            return [], None
        pending = min(self.tasks, default=None)
        ready = sorted(o for o in self.done if pending is None or o < pending)
        if not ready:
            return [], None
        outcomes = [self.done.pop(o) for o in ready]
        self.next_offset = ready[-1] + 1
        return outcomes, self.next_offset

    def cancel(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()
        self.done.clear()
