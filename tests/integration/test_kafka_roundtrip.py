"""Every record type: produce to its topic on the real broker -> consume -> equal, right key and partition."""
import pytest
from aiokafka import TopicPartition
from aiokafka.partitioner import murmur2

from plumbing.kafka.clients import make_consumer, publish
from schemas.codec import decode, record_key
from schemas.topics import TOPICS
from tests.factories import make_event

EVERY_TYPE = [(topic.name, model.model_fields["type"].default) for topic in TOPICS for model in topic.carries]


def java_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partitioner, so non-Python producers agree on placement."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@pytest.fixture(scope="module")
async def round_trips(bootstrap, topics, settings):
    from plumbing.kafka.clients import make_producer

    producer = make_producer(bootstrap)
    await producer.start()
    sent = {}
    try:
        for topic, type_name in EVERY_TYPE:
            event = make_event(type_name)
            meta = await publish(producer, topic, event)
            sent[(topic, type_name)] = (event, meta)
    finally:
        await producer.stop()
    consumer = make_consumer(bootstrap)
    await consumer.start()
    received = {}
    try:
        for key, (event, meta) in sent.items():
            tp = TopicPartition(meta.topic, meta.partition)
            consumer.assign([tp])
            consumer.seek(tp, meta.offset)
            batch = await consumer.getone()
            received[key] = batch
    finally:
        await consumer.stop()
    return sent, received


@pytest.mark.parametrize(("topic", "type_name"), EVERY_TYPE)
def test_record_round_trips_with_key_and_partition(round_trips, settings, topic, type_name):
    sent, received = round_trips
    event, meta = sent[(topic, type_name)]
    record = received[(topic, type_name)]
    assert decode(topic, record.value) == event
    assert record.key == record_key(topic, event)  # the topic's key field, or a marker's own key
    assert record.partition == java_partition(record.key, settings.topic_partitions)
    assert (record.topic, record.offset) == (meta.topic, meta.offset)
    headers = dict(record.headers)
    assert headers["type"] == type_name.encode()
    if getattr(event, "epoch", None) is not None:
        assert headers["epoch"] == str(event.epoch).encode()


async def test_one_generation_stays_in_one_partition_in_order(producer, bootstrap):
    first = make_event("Admitted")
    events = [first] + [make_event(t, tenant_id=first.tenant_id, generation_id=first.generation_id)
                        for t in ("AttemptStarted", "UsageReported", "Completed")]
    metas = [await publish(producer, "llm.generations", e) for e in events]
    assert len({m.partition for m in metas}) == 1
    assert [m.offset for m in metas] == sorted(m.offset for m in metas)


async def test_paced_fetches_are_what_the_consumers_next_fetch_request_asks_for(bootstrap, topics):
    """`pace_fetches` reaches into aiokafka's fetcher (no public setter): the fetch request it builds next must
    carry the new hold, and going back restores the first one."""
    from plumbing.kafka.clients import LONG_POLL_MS, pace_fetches
    from schemas.topics import TOKENS

    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(TOKENS, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)

        def next_request() -> tuple[int, int]:
            """The fetch the consumer would send next (the one already in flight set aside)."""
            fetcher = consumer._fetcher
            in_flight, fetcher._in_flight = fetcher._in_flight, set()
            try:
                requests, *_ = fetcher._get_actions_per_node(consumer._subscription.subscription.assignment)
            finally:
                fetcher._in_flight = in_flight
            (_, request), = requests
            return request._max_wait_ms, request._min_bytes

        assert next_request() == (LONG_POLL_MS, 1)
        pace_fetches(consumer, 1 << 20, 50)
        assert next_request() == (50, 1 << 20)
        pace_fetches(consumer, 1, LONG_POLL_MS)
        assert next_request() == (LONG_POLL_MS, 1)
    finally:
        await consumer.stop()


async def test_every_role_counts_the_requests_its_clients_send(bootstrap, topics):
    """A produce is one Produce request of its client, an idle consumer's long polls are Fetch requests of its
    client, and the counts reach a role's /metrics text."""
    import uuid

    from plumbing.kafka.clients import make_producer
    from plumbing.kafka.request_counts import COUNTS
    from plumbing.telemetry.metrics import GatewayMetrics, exposition
    from schemas.topics import TOKENS
    from tests.waiting import wait_until

    name = f"counted-{uuid.uuid4().hex[:8]}"
    producer = make_producer(bootstrap, client_id=f"{name}-p", linger_ms=0)
    consumer = make_consumer(bootstrap, client_id=f"{name}-c", auto_offset_reset="latest")
    await producer.start()
    await consumer.start()
    try:
        for _ in range(3):
            await publish(producer, "llm.generations", make_event("Admitted"))
        produced = COUNTS[(f"{name}-p", "Produce")]
        assert produced >= 3, dict(COUNTS)  # a retry (a leader moving) is one more
        consumer.assign([TopicPartition(TOKENS, 0)])
        await wait_until(lambda: COUNTS[(f"{name}-c", "Fetch")] >= 3, timeout_s=30)
        text = exposition(GatewayMetrics().registry).decode()
        assert f'ledgerlm:kafka_requests_total{{api="Produce",client="{name}-p"}} {float(produced)}' in text
        assert f'api="Fetch",client="{name}-c"' in text
    finally:
        await consumer.stop()
        await producer.stop()
