"""Consumer-group offsets set by hand."""
from __future__ import annotations

from aiokafka import AIOKafkaConsumer

from consumers.kafka.clients import partitions_of


async def move_group_to_end(bootstrap: str, group: str, topic: str) -> None:
    """Commit the current end of every partition for `group`: a new group starts at now, not at history."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = await partitions_of(consumer, topic)
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.commit({tp: ends[tp] for tp in tps})
    finally:
        await consumer.stop()
