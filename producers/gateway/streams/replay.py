"""Where a starting gateway's bridge begins each partition of `llm.generations` / `llm.tokens`.

    offset 0 ........ projected (Postgres has applied) ........ end at start ...... live
                      └─ the bridge starts here ─▶ caught up (ready) ─▶ follows

The projections in Postgres hold every record before their stored offset; the
bridge reads every record from it. Together they cover the whole log, so a
generation admitted before this gateway started, on any gateway, is in one of
the two however far the projector lags (issue 19: read-your-writes). The
replay is bounded by log time (`bridge_replay_max_s`) and by retention: a
projection further behind than that leaves a hole, which reads of owned ids
wait out and then answer 503, never 404 (`producers/gateway/native/lookup.py`).
This works per partition, so a gateway following only its share of the
partitions starts each of them the same way.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger(__name__)

Projected = Callable[[list[str]], Awaitable[dict[tuple[str, int], int]]]


def replay_from(projected: Projected, max_age_s: float, clock=time.time):
    """The bridge's start positions (`plumbing.kafka.follower.StartPositions`): the projections' offsets, no
    earlier than `max_age_s` of log time nor than what the log still retains."""

    async def positions(consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        stored = await projected(sorted({tp.topic for tp in partitions}))
        firsts = await consumer.beginning_offsets(partitions)
        ends = await consumer.end_offsets(partitions)
        since = await consumer.offsets_for_times({tp: int((clock() - max_age_s) * 1000) for tp in partitions})
        starts = {}
        for tp in partitions:
            floor = since[tp].offset if since[tp] is not None else ends[tp]
            starts[tp] = max(stored.get((tp.topic, tp.partition), firsts[tp]), floor, firsts[tp])
        log.info("bridge replay records=%d partitions=%d", sum(ends[tp] - starts[tp] for tp in partitions),
                 len(partitions))
        return starts

    return positions
