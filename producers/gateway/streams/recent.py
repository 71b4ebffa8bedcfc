"""The last records the bridge read of each partition, undecoded: what a first subscriber's backfill scans.

    reader starts tp at S ──▶ [batch][batch]...[batch] ──▶ next offset
                              └ kept: at most `limit` records per partition, oldest batches dropped first

Keeping a fetched batch costs one list append (the records are already in
memory), so skipping stays cheap. A backfill of the range [from, until) is
served from here when the ring holds every record of it: nothing was dropped
after `from`, and the reader's start (`S`) is not after `from`. Otherwise the
backfill reads Kafka (`backfill.py`).
"""
from __future__ import annotations

from collections import deque

from aiokafka import ConsumerRecord, TopicPartition

RECENT_RECORDS = 20_000  # per partition: at ~0.5 KiB a record, ~10 MiB each at most


class RecentRecords:
    def __init__(self, limit: int = RECENT_RECORDS) -> None:
        self.limit = limit
        self.batches: dict[TopicPartition, deque[list[ConsumerRecord]]] = {}
        self.counts: dict[TopicPartition, int] = {}
        self.held_from: dict[TopicPartition, int] = {}  # every record of tp from this offset on is held
        self.next: dict[TopicPartition, int] = {}
        self.from_projections: set[TopicPartition] = set()  # held from where the projections stood: complete

    def start(self, tp: TopicPartition, offset: int, at_projections: bool) -> None:
        """A reader starts `tp` at `offset`; where the previous one stopped, what is held goes on."""
        if self.next.get(tp) == offset:
            return
        self.batches[tp] = deque()
        self.counts[tp] = 0
        self.held_from[tp] = self.next[tp] = offset
        if at_projections:
            self.from_projections.add(tp)
        else:
            self.from_projections.discard(tp)

    def complete(self, tp: TopicPartition) -> bool:
        """Held from where the projections stood when its reader started, nothing dropped since."""
        return tp in self.from_projections

    def forget(self, tp: TopicPartition) -> None:
        for held in (self.batches, self.counts, self.held_from, self.next):
            held.pop(tp, None)
        self.from_projections.discard(tp)

    def add(self, tp: TopicPartition, records: list[ConsumerRecord]) -> None:
        batches = self.batches.get(tp)
        if batches is None:
            return
        batches.append(records)
        self.counts[tp] += len(records)
        self.next[tp] = records[-1].offset + 1
        while self.counts[tp] > self.limit and len(batches) > 1:
            dropped = batches.popleft()
            self.counts[tp] -= len(dropped)
            self.held_from[tp] = batches[0][0].offset
            self.from_projections.discard(tp)

    def holds(self, tp: TopicPartition, start: int) -> bool:
        """Every record of `tp` from `start` on (up to what was read) is held here."""
        return tp in self.held_from and self.held_from[tp] <= start

    def of_key(self, tp: TopicPartition, key: bytes, until: int) -> list[ConsumerRecord]:
        return [record for batch in self.batches.get(tp, ()) for record in batch
                if record.key == key and record.offset < until]
