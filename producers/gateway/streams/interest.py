"""Which generations this gateway wants the records of: those with a local subscriber or a waiting lookup.

The bridge decodes a token record only when its key (the generation id) is in
`keys`; every other one is skipped before JSON decoding, so a gateway spends
on a record of a generation nobody watches here only a set lookup. Interest is
counted: the second subscriber of one generation costs nothing more, and the
last one leaving drops it.
"""
from __future__ import annotations

from collections import Counter

from plumbing.kafka.follower import partition_for


class Interest:
    def __init__(self) -> None:
        self.keys: set[bytes] = set()  # record keys as they arrive: the hot path compares bytes, no decoding
        self.counts: Counter[str] = Counter()
        self.partitions = 1  # of llm.tokens (== llm.generations: co-partitioned), known once the bridge starts
        self.by_partition: Counter[int] = Counter()

    def partition_of(self, generation_id: str) -> int:
        return partition_for(generation_id, self.partitions)

    def add(self, generation_id: str) -> bool:
        """One more interested party; True for the first (the records skipped so far must be read back)."""
        self.counts[generation_id] += 1
        if self.counts[generation_id] > 1:
            return False
        self.keys.add(generation_id.encode())
        self.by_partition[self.partition_of(generation_id)] += 1
        return True

    def remove(self, generation_id: str) -> bool:
        """One party less; True when it was the last."""
        self.counts[generation_id] -= 1
        if self.counts[generation_id] > 0:
            return False
        del self.counts[generation_id]
        self.keys.discard(generation_id.encode())
        partition = self.partition_of(generation_id)
        self.by_partition[partition] -= 1
        if self.by_partition[partition] <= 0:
            del self.by_partition[partition]
        return True

    def wanted(self, generation_id: str) -> bool:
        return generation_id in self.counts

    def in_partition(self, partition: int) -> bool:
        return self.by_partition[partition] > 0
