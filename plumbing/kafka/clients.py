"""The one factory of Kafka clients: every producer, consumer, admin client and FastStream broker.

aiokafka's defaults are not safe for us: producers must be idempotent with
acks=all, and consumers of transactional output must read committed data
only, with offsets committed explicitly by the code that applied them. Every
client also authenticates as its `KafkaAccess` says (SASL, TLS): nothing else
constructs a client, so no connection can bypass those settings
(tests/unit/test_kafka_clients.py scans the code for any that does).
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import BaseModel

from plumbing.kafka.access import KafkaAccess
from plumbing.kafka.request_counts import count_requests
from schemas.codec import encode, record_headers, record_key

# How long the broker holds a fetch that finds no new record. A record that arrives meanwhile answers the
# fetch at once (fetch.min.bytes is 1), so a longer wait costs no latency; a short one only makes idle
# consumers ask again and again (at 10 ms, 100 fetches a second each: most of an idle stack's CPU; at
# 500 ms an idle stack still sent ~22 fetches a second, half the broker's idle burn). What does wait for
# it: a seek within an unchanged assignment is read after the fetch in flight returns (a new assignment
# cancels that fetch), so nothing that seeks on a latency path may rely on this default.
LONG_POLL_MS = 2000

# Group membership for members whose loss only delays work (projector, exporter): a heartbeat every second
# and 20 s without one before the broker drops the member. With aiokafka's defaults (3 s, 10 s) a lone
# projector beside a chaos stack and 2 CPU-bound processes was dropped and rejoined every ~30 s, decoding
# and applying big polls on a starved machine, each rejoin a rebalance of its whole assignment (Kafka
# raised its own default to 45 s in KIP-735 for the same reason). The cost: a member killed -9 keeps its
# partitions up to 20 s before the group hands them on.
PATIENT_MEMBER = {"session_timeout_ms": 20000, "heartbeat_interval_ms": 1000}


Kafka = KafkaAccess | str  # a bare bootstrap string: unauthenticated PLAINTEXT (local development)


def make_producer(kafka: Kafka, transactional_id: str | None = None, client_id: str = "ledgerlm",
                  linger_ms: int = 2) -> AIOKafkaProducer:
    # A transaction begun right after a commit meets CONCURRENT_TRANSACTIONS until the broker has written the
    # previous markers; aiokafka then retries after retry_backoff_ms (100 ms by default), a latency cliff for
    # one-transaction-per-batch processors. Ten ms is plenty on a broker that answers in under one.
    producer = AIOKafkaProducer(
        **KafkaAccess.of(kafka).client_options(),
        client_id=client_id,
        enable_idempotence=True,
        acks="all",
        transactional_id=transactional_id,
        linger_ms=linger_ms,
        retry_backoff_ms=10 if transactional_id else 100,
    )
    count_requests(producer, client_id)
    return producer


def make_consumer(kafka: Kafka, *topics: str, group_id: str | None = None,
                  auto_offset_reset: str = "earliest", client_id: str = "ledgerlm",
                  fetch_min_bytes: int = 1, fetch_max_wait_ms: int = LONG_POLL_MS,
                  isolation_level: str = "read_committed", **timeouts: int) -> AIOKafkaConsumer:
    """A consumer that never commits on its own, read-committed unless told (`read_uncommitted` sees records
    of transactions still open: for reading a log's true end); `timeouts` are aiokafka's (a group member's
    session_timeout_ms and heartbeat_interval_ms, request_timeout_ms)."""
    consumer = AIOKafkaConsumer(
        *topics,
        **KafkaAccess.of(kafka).client_options(),
        client_id=client_id,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset=auto_offset_reset,
        isolation_level=isolation_level,
        fetch_min_bytes=fetch_min_bytes,
        fetch_max_wait_ms=fetch_max_wait_ms,
        **timeouts,
    )
    count_requests(consumer, client_id)
    return consumer


def pace_fetches(consumer: AIOKafkaConsumer, min_bytes: int, max_wait_ms: int) -> None:
    """From its next fetch on, the broker answers `consumer` once it has `min_bytes` for it or after `max_wait_ms`.

    A fetch costs a Python consumer about 0.4 ms of CPU whatever it carries, so one reading a stream of small
    records nobody waits for spends most of its CPU on fetches of a few records each; a long wait with a large
    minimum makes each fetch carry hundreds. aiokafka reads both values from its fetcher for every request and
    has no public setter for them (tests/integration/test_kafka_roundtrip.py fails if that changes)."""
    fetcher = consumer._fetcher  # noqa: SLF001
    fetcher._fetch_min_bytes = min_bytes  # noqa: SLF001
    fetcher._fetch_max_wait_ms = max_wait_ms  # noqa: SLF001


def make_admin(kafka: Kafka, request_timeout_ms: int = 15000, client_id: str = "ledgerlm-admin") -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(**KafkaAccess.of(kafka).client_options(), client_id=client_id,
                               request_timeout_ms=request_timeout_ms)


def make_broker(kafka: Kafka, **options):
    """A FastStream KafkaBroker with the same security (FastStream takes it as a `security=` object)."""
    from faststream.kafka import KafkaBroker

    return KafkaBroker(KafkaAccess.of(kafka).bootstrap, security=faststream_security(KafkaAccess.of(kafka)),
                       **options)


def faststream_security(access: KafkaAccess):
    from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512

    if access.protocol == "PLAINTEXT":
        return None
    context = access.client_options().get("ssl_context")
    if access.principal is None:
        return BaseSecurity(ssl_context=context, use_ssl=True)
    kinds = {"PLAIN": SASLPlaintext, "SCRAM-SHA-256": SASLScram256, "SCRAM-SHA-512": SASLScram512}
    return kinds[access.principal.mechanism](access.principal.username, access.principal.password.get_secret_value(),
                                             ssl_context=context, use_ssl=access.uses_tls)


async def publish(producer: AIOKafkaProducer, topic: str, event: BaseModel, partition: int | None = None):
    """Send one event keyed and headed as its topic declares; returns the record metadata."""
    return await producer.send_and_wait(
        topic, value=encode(event), key=record_key(topic, event), headers=record_headers(event), partition=partition,
    )


async def partitions_of(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """Every partition of `topic`, from fresh cluster metadata (a manually assigned consumer has none)."""
    # `topics()` fetches fresh metadata but keeps it to itself; ask the client for that snapshot directly.
    cluster = await consumer._client.fetch_all_metadata()  # noqa: SLF001
    partitions = cluster.partitions_for_topic(topic)
    if not partitions:
        raise LookupError(f"topic {topic} has no partitions (run `ledgerlm topics ensure`)")
    return [TopicPartition(topic, p) for p in sorted(partitions)]


async def read_to_end(consumer: AIOKafkaConsumer,
                      tps: list[TopicPartition]) -> AsyncIterator[tuple[TopicPartition, list[ConsumerRecord]]]:
    """Batches of every record from each partition's position up to its end as of this call."""
    ends = await consumer.end_offsets(tps)
    pending = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
    while pending:
        for tp, records in (await consumer.getmany(*pending, timeout_ms=500)).items():
            yield tp, records
        pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
