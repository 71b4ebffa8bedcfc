"""A record that fails to decode lands in llm.dlq with its reason, and the consumer goes on."""
import asyncio
import base64
import json

import psycopg
from aiokafka import TopicPartition

from plumbing.kafka.clients import make_consumer
from plumbing.kafka.dead_letters import DeadLetterRouter
from producers.tenant_admin import project_tenants
from schemas.codec import decode, encode
from schemas.topics import DLQ, GENERATIONS, TENANTS
from tests.factories import make_event


async def dead_letters_after(bootstrap, offsets: dict[TopicPartition, int]) -> list:
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        for tp, offset in offsets.items():
            consumer.seek(tp, offset)
        letters = []
        for _ in range(20):
            batches = await consumer.getmany(timeout_ms=250)
            letters += [decode(DLQ, r.value) for rs in batches.values() for r in rs]
            if letters and not batches:
                break
        return letters
    finally:
        await consumer.stop()


async def dlq_end_offsets(bootstrap) -> dict[TopicPartition, int]:
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        partitions = [TopicPartition(DLQ, p) for p in consumer.partitions_for_topic(DLQ) or range(6)]
        return await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()


async def test_router_diverts_bad_record_and_decodes_the_next(producer, bootstrap):
    good = make_event("Completed")
    key = good.generation_id.encode()
    bad_meta = await producer.send_and_wait(GENERATIONS, value=b'{"type": "Completed", "epoch": "one"}', key=key)
    good_meta = await producer.send_and_wait(GENERATIONS, value=encode(good), key=key)
    before = await dlq_end_offsets(bootstrap)

    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(GENERATIONS, bad_meta.partition)
        consumer.assign([tp])
        consumer.seek(tp, bad_meta.offset)
        router = DeadLetterRouter(producer)
        decoded = [await router.decode_or_divert(await consumer.getone()) for _ in range(2)]
    finally:
        await consumer.stop()

    assert decoded == [None, good]
    assert good_meta.offset == bad_meta.offset + 1
    letters = [letter for letter in await dead_letters_after(bootstrap, before)
               if letter.source_topic == GENERATIONS and letter.offset == bad_meta.offset]
    assert len(letters) == 1
    letter = letters[0]
    assert letter.error_class == "InvalidEvent"
    assert "epoch" in letter.reason
    assert letter.partition == bad_meta.partition
    assert base64.b64decode(letter.payload_b64) == b'{"type": "Completed", "epoch": "one"}'
    assert base64.b64decode(letter.key_b64) == key


async def test_projection_skips_bad_record_and_applies_the_next(producer, bootstrap, database_url):
    tenant = make_event("TenantRegistered")
    garbage = json.dumps({"type": "TenantRegistered", "tenant_id": tenant.tenant_id}).encode()
    bad = await producer.send_and_wait(TENANTS, value=garbage, key=tenant.tenant_id.encode())
    good = await producer.send_and_wait(TENANTS, value=encode(tenant), key=tenant.tenant_id.encode())
    before = await dlq_end_offsets(bootstrap)
    with psycopg.connect(database_url, autocommit=True) as conn:
        await project_tenants(bootstrap, database_url)
        row = conn.execute("SELECT name, weight FROM tenants WHERE tenant_id = %s", (tenant.tenant_id,)).fetchone()
        stored = conn.execute(
            "SELECT next_offset FROM projection_offsets WHERE projection = 'tenants' AND topic = %s "
            "AND partition = %s", (TENANTS, good.partition)).fetchone()
    assert row == (tenant.tenant_id, 3.0)
    assert stored[0] >= good.offset + 1
    letters = [letter for letter in await dead_letters_after(bootstrap, before)
               if letter.source_topic == TENANTS and letter.offset == bad.offset]
    assert [letter.error_class for letter in letters] == ["InvalidEvent"]
    assert "limits" in letters[0].reason
