"""Consumer-group offsets set by hand."""
from __future__ import annotations

from plumbing.kafka.clients import Kafka, make_consumer, partitions_of


async def move_group_to_end(kafka: Kafka, group: str, topic: str) -> None:
    """Commit the current end of every partition for `group`: a new group starts at now, not at history."""
    consumer = make_consumer(kafka, group_id=group, client_id="ledgerlm-group-admin", auto_offset_reset="latest")
    await consumer.start()
    try:
        tps = await partitions_of(consumer, topic)
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.commit({tp: ends[tp] for tp in tps})
    finally:
        await consumer.stop()
