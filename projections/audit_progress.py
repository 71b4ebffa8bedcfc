"""How far a replay got, on stderr: records replayed / total per projection, the rate and an ETA.

    audit replay: stream 31200/50578 (62%) generations 11802/11802 (100%) | 24100 records/s, ETA 1s
"""
from __future__ import annotations

import time
from typing import TextIO

from aiokafka import TopicPartition


class ReplayProgress:
    """Told the partitions' positions after every poll (`Projector.catch_up`'s `on_progress`)."""

    def __init__(self, out: TextIO | None, name_of: dict[str, str], targets: dict[TopicPartition, int],
                 every_s: float = 1.0) -> None:
        self.out = out
        self.name_of = name_of  # topic -> projection name
        self.targets = targets
        self.every_s = every_s
        self.start: dict[TopicPartition, int] | None = None
        self.began = time.monotonic()
        self.last_print = 0.0
        self.done: dict[str, int] = {}
        self.total: dict[str, int] = {}

    def __call__(self, positions: dict[TopicPartition, int]) -> None:
        if self.start is None:
            self.start = {tp: min(positions.get(tp, 0), end) for tp, end in self.targets.items()}
        self.done, self.total = {}, {}
        for tp, end in self.targets.items():
            name = self.name_of[tp.topic]
            at = min(positions.get(tp, self.start[tp]), end)
            self.done[name] = self.done.get(name, 0) + at - self.start[tp]
            self.total[name] = self.total.get(name, 0) + end - self.start[tp]
        now = time.monotonic()
        if self.out is not None and (now - self.last_print >= self.every_s or self.finished):
            self.last_print = now
            print(self.line(now), file=self.out, flush=True)

    @property
    def finished(self) -> bool:
        return sum(self.done.values()) >= sum(self.total.values())

    def line(self, now: float) -> str:
        parts = [f"{name} {self.done[name]}/{self.total[name]} ({100 * self.done[name] // max(1, self.total[name])}%)"
                 for name in sorted(self.total)]
        done, total = sum(self.done.values()), sum(self.total.values())
        rate = done / max(now - self.began, 1e-6)
        eta = f"ETA {(total - done) / rate:.0f}s" if rate > 0 and done < total else "done"
        return f"audit replay: {' '.join(parts)} | {rate:.0f} records/s, {eta}"
