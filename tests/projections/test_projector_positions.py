"""A projector applies each record once, wherever its consumer stands (real Kafka and PostgreSQL).

The log of chaos run 3's audit difference: the controller's Interrupted appended before the worker's delayed
AttemptStarted of the same epoch. Applied once, the attempt's row stays open (nothing closed it when it was
inserted); applied again after the AttemptStarted, the Interrupted closes it, dated before its start, while
every other table stays the same. So the live projection had re-applied records a replay applies once.
"""
import asyncio
import threading
import uuid

import psycopg
from aiokafka import AIOKafkaConsumer, TopicPartition

from plumbing.kafka.clients import make_consumer, make_producer, publish
from projections.lifecycle import LifecycleProjection
from projections.offsets import load_offsets
from projections.runtime import Projector
from schemas.topics import GENERATIONS
from tests.projections.conftest import Gen, one
from tests.waiting import wait_until

ATTEMPT = "SELECT ended_at, end_reason FROM attempts WHERE generation_id = %s AND epoch = 1"


async def interrupted_before_started(producer) -> tuple[Gen, TopicPartition, int, int]:
    """The generation, its partition, and the offsets of its first and last records."""
    gen = Gen(tenant_id="rewind-tenant", generation_id=f"gen-{uuid.uuid4().hex[:12]}")
    sent = [await publish(producer, GENERATIONS, event) for event in (gen.admitted(), gen.interrupted(),
                                                                       gen.started())]
    return gen, TopicPartition(GENERATIONS, sent[0].partition), sent[0].offset, sent[-1].offset


async def apply_through(projector: Projector, consumer: AIOKafkaConsumer, tp: TopicPartition, last: int) -> None:
    """Poll and apply as the projector's loop does until the consumer is past offset `last`."""
    positions = []

    async def past_last() -> bool:
        positions.append(await consumer.position(tp))
        if positions[-1] > last:
            return True
        batches = await consumer.getmany(tp, timeout_ms=500)
        if batches:
            await projector._apply_polled(consumer, batches)
        return False

    await wait_until(past_last, 30, step_s=0, what=lambda _: f"the consumer past {last}, stuck at {positions[-1]}")


async def publish_in_a_transaction(bootstrap: str, event):
    """The event's record metadata; a commit marker follows the record in its partition."""
    producer = make_producer(bootstrap, transactional_id=f"test-marker-{uuid.uuid4().hex[:8]}")
    await producer.start()
    try:
        async with producer.transaction():
            return await publish(producer, GENERATIONS, event)
    finally:
        await producer.stop()


def stored_offset(database_url: str, tp: TopicPartition) -> int:
    with psycopg.connect(database_url) as conn:
        return load_offsets(conn, "generations", GENERATIONS)[tp.partition]


async def test_records_before_the_stored_offset_are_not_applied_again(producer, bootstrap, projection_db):
    gen, tp, first, last = await interrupted_before_started(producer)
    projector = Projector(bootstrap, projection_db, [LifecycleProjection()])
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        consumer.assign([tp])
        await projector._seek_stored(consumer, [tp])
        await apply_through(projector, consumer, tp, last)
        consumer.seek(tp, first)  # where a consumer stands when its assignment's seek did not run
        await apply_through(projector, consumer, tp, last)
    finally:
        await consumer.stop()
        projector.close()
    with psycopg.connect(projection_db) as conn:
        assert one(conn, ATTEMPT, gen.generation_id) == (None, None)
        assert one(conn, "SELECT status, started_at FROM generations WHERE generation_id = %s",
                   gen.generation_id) == ("interrupted", None)
    assert projector.stats.applied == {"generations": 3}
    assert stored_offset(projection_db, tp) == last + 1


class HeldProjection(LifecycleProjection):
    """The lifecycle projection, holding its batch open (inside the projector's transaction) until released."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.release = threading.Event()

    def apply(self, conn, events) -> None:
        self.holding.set()
        assert self.release.wait(30), "never released"
        super().apply(conn, events)


async def test_an_assignment_during_a_batch_seeks_from_committed_offsets(producer, bootstrap, projection_db):
    """aiokafka runs the rebalance listener in its own task, so an assignment's offsets are loaded while a
    batch may be in flight: that must neither touch the batch's transaction nor lead to applying it twice."""
    gen, tp, first, last = await interrupted_before_started(producer)
    held = HeldProjection()
    projector = Projector(bootstrap, projection_db, [held])
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        consumer.assign([tp])
        await projector._seek_stored(consumer, [tp])
        before = projector.stored[tp]
        batches: dict[TopicPartition, list] = {tp: []}

        async def all_came() -> bool:
            if await consumer.position(tp) > last:
                return True
            batches[tp] += (await consumer.getmany(tp, timeout_ms=500)).get(tp, [])
            return False

        await wait_until(all_came, 30, step_s=0, what="the records")
        batch = asyncio.create_task(projector._apply_polled(consumer, batches))
        assert await asyncio.to_thread(held.holding.wait, 30)
        await projector._seek_stored(consumer, [tp])  # the partition assigned again meanwhile
        assert await consumer.position(tp) == before  # what was committed: the batch is not yet
        held.release.set()
        await batch
        await apply_through(projector, consumer, tp, last)
    finally:
        held.release.set()
        await consumer.stop()
        projector.close()
    with psycopg.connect(projection_db) as conn:
        assert one(conn, ATTEMPT, gen.generation_id) == (None, None)
    assert projector.stats.applied == {"generations": 3}
    assert stored_offset(projection_db, tp) == last + 1


async def test_a_partition_whose_last_write_was_a_transaction_is_passed_to_its_end(bootstrap, projection_db):
    """The commit marker after a transaction's record takes an offset no record comes back for: after a poll
    with no records the projector's stored offset moves on past it, to the partition's end."""
    gen = Gen(tenant_id="marker-tenant", generation_id=f"gen-{uuid.uuid4().hex[:12]}")
    sent = await publish_in_a_transaction(bootstrap, gen.admitted())
    tp = TopicPartition(GENERATIONS, sent.partition)
    projector = Projector(bootstrap, projection_db, [LifecycleProjection()])
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, sent.offset)
        await apply_through(projector, consumer, tp, sent.offset)
        assert stored_offset(projection_db, tp) == sent.offset + 1  # the record's own next offset

        async def at_the_end() -> tuple[int, int]:
            if not await consumer.getmany(tp, timeout_ms=200):
                await projector._pass_skipped(consumer)
            return stored_offset(projection_db, tp), await consumer.position(tp)

        stored, position = await wait_until(at_the_end, 30, step_s=0, accept=lambda at: at[0] == at[1] > sent.offset + 1,
                                            what=lambda at: f"the stored offset at the position past the marker {at}")
    finally:
        await consumer.stop()
        projector.close()
    assert projector.stats.applied == {"generations": 1}
    assert stored >= sent.offset + 2


async def test_a_batch_is_committed_against_the_offset_it_was_read_from(producer, bootstrap, projection_db):
    """The rebalance listener may load a newer stored offset (another member's progress) while a batch is still
    being decoded: the batch must then be refused as stale, not committed against the newer offset and applied
    a second time."""
    from projections.runtime import decode_quietly

    gen, tp, first, last = await interrupted_before_started(producer)
    other = Projector(bootstrap, projection_db, [LifecycleProjection()])
    other_consumer = make_consumer(bootstrap)
    consumer = make_consumer(bootstrap)
    reassigned: list[int] = []

    async def decode_after_a_reassignment(record):
        if not reassigned:  # the other member applies the same records; then this member's listener runs
            await apply_through(other, other_consumer, tp, last)
            await projector._seek_stored(consumer, [tp])
            reassigned.append(projector.stored[tp])
        return await decode_quietly(record)

    projector = Projector(bootstrap, projection_db, [LifecycleProjection()], divert=decode_after_a_reassignment)
    await other_consumer.start()
    await consumer.start()
    try:
        for member, member_consumer in ((other, other_consumer), (projector, consumer)):
            member_consumer.assign([tp])
            await member._seek_stored(member_consumer, [tp])
        await apply_through(projector, consumer, tp, last)
    finally:
        await consumer.stop()
        await other_consumer.stop()
        projector.close()
        other.close()
    assert reassigned == [last + 1]
    with psycopg.connect(projection_db) as conn:
        assert one(conn, ATTEMPT, gen.generation_id) == (None, None)  # applied twice, the Interrupted closes it
    assert other.stats.applied == {"generations": 3}
    assert projector.stats.applied.get("generations", 0) == 0
    assert projector.stats.stale_refusals == 1
    assert stored_offset(projection_db, tp) == last + 1


async def test_a_catch_up_stands_past_markers_before_its_target_and_applies_nothing_at_it(producer, bootstrap,
                                                                                         projection_db):
    """A replay to live's offsets must end where live stands: live moves past a commit marker after an empty
    poll, so the replay passes the markers before its target too, but never the record at the target."""
    inside, after = (Gen(tenant_id="catch-up-tenant", generation_id=f"gen-{uuid.uuid4().hex[:12]}") for _ in "ab")
    sent = await publish_in_a_transaction(bootstrap, inside.admitted())
    tp = TopicPartition(GENERATIONS, sent.partition)
    ends = make_consumer(bootstrap, isolation_level="read_uncommitted")  # its end counts the marker once written
    await ends.start()
    try:  # the broker writes the commit marker after the commit returns
        await wait_until(lambda: ends.end_offsets([tp]), 30, step_s=0.05, accept=lambda at: at[tp] > sent.offset + 1,
                         what="the commit marker")
    finally:
        await ends.stop()
    beyond = await publish(producer, GENERATIONS, after.admitted(), partition=tp.partition)
    assert beyond.offset >= sent.offset + 2  # the commit marker lies between them
    projector = Projector(bootstrap, projection_db, [LifecycleProjection()])
    try:
        await projector.catch_up({tp: beyond.offset})
    finally:
        projector.close()
    assert stored_offset(projection_db, tp) == beyond.offset
    with psycopg.connect(projection_db) as conn:
        assert one(conn, "SELECT count(*) FROM generations WHERE generation_id = ANY(%s)",
                   [inside.generation_id, after.generation_id]) == (1,)
        assert one(conn, "SELECT status FROM generations WHERE generation_id = %s", inside.generation_id) == (
            "admitted",)
