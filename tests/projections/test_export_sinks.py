"""`ledgerlm export`: every sealed attempt to each sink once, on the real broker and database; OpenMeter and
Lago through contract doubles (tests/projections/billing_doubles.py), Stripe through stripe-mock."""
from __future__ import annotations

import base64
import json
import uuid

import pytest
from aiokafka import TopicPartition
from cloudevents.core.bindings.kafka import KafkaMessage, from_structured_event
from cloudevents.core.formats.json import JSONFormat

from plumbing.kafka.clients import make_consumer
from projections.export import ledger
from projections.export.reconcile import reconcile
from projections.export.runtime import Exporter
from projections.export.sinks.base import Backoff
from projections.export.sinks.kafka import KafkaSink
from projections.export.sinks.lago import LagoSink
from projections.export.sinks.openmeter import OpenMeterSink
from projections.export.sinks.stripe import StripeSink
from schemas.codec import decode
from schemas.topics import DLQ, USAGE_EXPORT
from schemas.values import BillingIds
from tests.projections.billing_doubles import BillingDouble, RecordingProxy
from tests.projections.export_helpers import (
    export_until_caught_up, ledger_rows, log_ends, rewind, seal_generations, sealed, start_sinks_at_end,
)

SOURCE = "ledgerlm://test"
FAST = Backoff(first_s=0.01, max_s=0.05)
STRIPE_EVENTS = {"input": "ledgerlm_input_tokens", "cached_input": "ledgerlm_cached_input_tokens",
                 "output": "ledgerlm_output_tokens"}


@pytest.fixture
async def export_db(bootstrap, projection_db):
    await start_sinks_at_end(bootstrap, projection_db)
    return projection_db


@pytest.fixture
def double():
    doubles = []

    def make(kind: str) -> BillingDouble:
        doubles.append(BillingDouble(kind).start())
        return doubles[-1]

    yield make
    for d in doubles:
        d.stop()


def exporter(bootstrap, database_url, sink) -> Exporter:
    return Exporter(bootstrap, database_url, sink, group_id=f"test-export-{uuid.uuid4().hex[:8]}", source=SOURCE,
                    max_records=50)


def expected_event(row: tuple, generation_id: str) -> dict:
    tenant, epoch, model, label, end_reason, billed_in, cached, out, sealed_at = row
    return {"id": f"usage:{generation_id}:{epoch}", "subject": tenant, "time": sealed_at,
            "data": {"generation_id": generation_id, "epoch": epoch, "model": model, "label": label,
                     "end_reason": end_reason, "input_tokens": billed_in, "cached_input_tokens": cached,
                     "output_tokens": out}}


async def test_kafka_sink_writes_each_seal_once_as_a_cloudevent_and_a_replay_from_zero_adds_none(
        bootstrap, producer, project, export_db, conn):
    before = await log_ends(bootstrap, USAGE_EXPORT)
    _, ids = await seal_generations(producer, project, 6)
    seals = sealed(conn, ids)
    assert len(seals) == 6
    began = ledger.positions(conn, "kafka")
    await export_until_caught_up(exporter(bootstrap, export_db, KafkaSink(bootstrap, SOURCE, print)), conn)
    rewind(conn, "kafka", began)  # every record again, from where the first run began
    await export_until_caught_up(exporter(bootstrap, export_db, KafkaSink(bootstrap, SOURCE, print)), conn)

    consumer = make_consumer(bootstrap)
    await consumer.start()
    events = []
    try:
        ends = await log_ends(bootstrap, USAGE_EXPORT)
        for partition, end in ends.items():
            tp = TopicPartition(USAGE_EXPORT, partition)
            consumer.assign([tp])
            consumer.seek(tp, before[partition])
            while await consumer.position(tp) < end:
                for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    headers = dict(record.headers)
                    assert headers["content-type"] == b"application/cloudevents+json"
                    events.append(from_structured_event(KafkaMessage(headers, record.key, record.value)))
                    assert decode(USAGE_EXPORT, record.value).id == events[-1].get_id()
    finally:
        await consumer.stop()
    got = {e.get_id(): {"id": e.get_id(), "subject": e.get_subject(), "time": e.get_time(), "data": e.get_data()}
           for e in events}
    assert len(events) == 6  # none twice, the replay included
    assert got == {f"usage:{gid}:1": expected_event(row, gid) for gid, row in seals.items()}
    assert {e.get_source() for e in events} == {SOURCE}
    assert {e.get_type() for e in events} == {"io.ledgerlm.usage.sealed"}
    assert {e.get_specversion() for e in events} == {"1.0"}
    assert reconcile(conn, "kafka") == []


async def test_openmeter_sink_retries_429_and_5xx_with_the_same_ids(bootstrap, producer, project, export_db, conn,
                                                                   double):
    meter = double("openmeter")
    meter.fail_next = [(503, {}), (429, {"Retry-After": "0"}), (500, {})]
    _, ids = await seal_generations(producer, project, 5)
    retries = []
    sink = OpenMeterSink(meter.url, "om-token", SOURCE, retries.append, FAST)
    await export_until_caught_up(exporter(bootstrap, export_db, sink), conn)

    assert [r.split(" on ")[0] for r in retries] == ["HTTP 503", "HTTP 429", "HTTP 500"]
    assert meter.accepted_ids() == sorted(f"usage:{gid}:1" for gid in ids)
    assert sorted(meter.deliveries) == meter.accepted_ids()  # the failed tries stored nothing; one success
    for event in meter.accepted.values():
        parsed = JSONFormat().read(None, json.dumps(event).encode())
        assert parsed.get_source() == SOURCE and parsed.get_subject() is not None
    assert ledger_rows(conn, "openmeter") == {gid: ("acknowledged", None) for gid in ids}
    assert reconcile(conn, "openmeter") == []


async def test_a_refused_seal_is_dead_lettered_with_the_sinks_reason_and_the_rest_exported(
        bootstrap, producer, project, export_db, conn, double):
    meter = double("openmeter")
    _, ids = await seal_generations(producer, project, 7)
    refused = ids[3]
    meter.refuse_ids = {f"usage:{refused}:1"}
    dlq_before = await log_ends(bootstrap, DLQ)
    run = exporter(bootstrap, export_db, OpenMeterSink(meter.url, None, SOURCE, print, FAST))
    await export_until_caught_up(run, conn)

    assert meter.accepted_ids() == sorted(f"usage:{gid}:1" for gid in ids if gid != refused)
    rows = ledger_rows(conn, "openmeter")
    assert rows[refused][0] == "dead-lettered" and rows[refused][1].startswith("HTTP 400 on /api/v1/events")
    assert {gid: outcome for gid, (outcome, _) in rows.items() if gid != refused} == {
        gid: "acknowledged" for gid in ids if gid != refused}
    assert (run.stats.exported, run.stats.dead_lettered) == (6, 1)
    assert run.metrics.dead_lettered._value.get() == 1  # noqa: SLF001 (the alerting counter)
    differences = reconcile(conn, "openmeter")
    assert [(d.kind, d.generation_id) for d in differences] == [("dead-lettered", refused)]

    letters = await read_dead_letters(bootstrap, dlq_before)
    assert [(letter.error_class, json.loads(base64.b64decode(letter.payload_b64))["id"]) for letter in letters] == [
        ("SinkRefused", f"usage:{refused}:1")]
    assert letters[0].reason.startswith("openmeter: HTTP 400")


async def read_dead_letters(bootstrap, before: dict[int, int]):
    consumer = make_consumer(bootstrap)
    await consumer.start()
    letters = []
    try:
        for partition, end in (await log_ends(bootstrap, DLQ)).items():
            tp = TopicPartition(DLQ, partition)
            consumer.assign([tp])
            consumer.seek(tp, before.get(partition, 0))
            while await consumer.position(tp) < end:
                for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    letter = decode(DLQ, record.value)
                    if letter.error_class == "SinkRefused":
                        letters.append(letter)
    finally:
        await consumer.stop()
    return letters


async def test_lago_sink_bills_the_tenants_subscription_once_per_transaction_id(bootstrap, producer, project,
                                                                              export_db, conn, double):
    lago = double("lago")
    mapped, mapped_ids = await seal_generations(producer, project, 3, BillingIds(lago_subscription_id="sub_42"))
    plain, plain_ids = await seal_generations(producer, project, 2)
    sink = LagoSink(lago.url, "lago-key", "llm_tokens", print, FAST)
    began = ledger.positions(conn, "lago")
    await export_until_caught_up(exporter(bootstrap, export_db, sink), conn)
    rewind(conn, "lago", began)
    await export_until_caught_up(exporter(bootstrap, export_db, LagoSink(lago.url, "k", "llm_tokens", print, FAST)),
                                 conn)

    assert sorted(lago.accepted) == sorted([("sub_42", f"usage:{gid}:1") for gid in mapped_ids] +
                                           [(plain, f"usage:{gid}:1") for gid in plain_ids])
    assert len(lago.deliveries) == 5  # the replay sent nothing
    seals = sealed(conn, mapped_ids)
    event = lago.accepted[("sub_42", f"usage:{mapped_ids[0]}:1")]
    _, _, model, label, _, billed_in, cached, out, sealed_at = seals[mapped_ids[0]]
    assert event == {"transaction_id": f"usage:{mapped_ids[0]}:1", "external_subscription_id": "sub_42",
                     "code": "llm_tokens", "timestamp": int(sealed_at.timestamp()),
                     "properties": {"model": model, "label": label, "input_tokens": billed_in,
                                    "cached_input_tokens": cached, "output_tokens": out}}
    assert reconcile(conn, "lago") == []


async def test_stripe_sink_sends_one_valid_meter_event_per_meter_to_stripe_mock(bootstrap, producer, project,
                                                                             export_db, conn, stripe_mock):
    """stripe-mock checks every request against Stripe's OpenAPI spec; the proxy keeps what was sent."""
    proxy = RecordingProxy(stripe_mock)
    try:
        _, ids = await seal_generations(producer, project, 4, BillingIds(stripe_customer_id="cus_ledgerlm_1"))
        _, orphan_ids = await seal_generations(producer, project, 1)  # a tenant without a Stripe customer
        run = exporter(bootstrap, export_db, StripeSink(proxy.url, "sk_test_123", STRIPE_EVENTS, print, FAST))
        await export_until_caught_up(run, conn)
    finally:
        proxy.stop()

    rows = ledger_rows(conn, "stripe")
    assert {gid: rows[gid] for gid in ids} == {gid: ("acknowledged", None) for gid in ids}
    assert rows[orphan_ids[0]][0] == "dead-lettered" and "has no Stripe customer" in rows[orphan_ids[0]][1]
    assert (run.stats.exported, run.stats.dead_lettered) == (4, 1)
    seals = sealed(conn, ids)
    expected = []
    for gid in ids:
        _, epoch, _, _, _, billed_in, cached, out, sealed_at = seals[gid]
        for meter, value in (("input", billed_in), ("cached_input", cached), ("output", out)):
            form = {"event_name": STRIPE_EVENTS[meter], "identifier": f"usage:{gid}:{epoch}:{meter}",
                    "payload[stripe_customer_id]": "cus_ledgerlm_1", "payload[value]": str(value),
                    "timestamp": str(int(sealed_at.timestamp()))}
            expected.append(("/v1/billing/meter_events", form, form["identifier"], 200))
    assert sorted(proxy.exchanges, key=lambda x: x[2]) == sorted(expected, key=lambda x: x[2])


async def test_the_oldest_unexported_seal_is_read_since_a_floor_through_the_seal_time_index(
        bootstrap, producer, project, export_db, conn):
    from datetime import timedelta

    _, ids = await seal_generations(producer, project, 6)
    times = sorted(row[-1] for row in sealed(conn, ids).values())
    assert ledger.oldest_unexported(conn, "kafka") == (times[0], times[-1])
    assert ledger.oldest_unexported(conn, "kafka", times[2]) == (times[2], times[-1])
    assert ledger.oldest_unexported(conn, "kafka", times[-1] + timedelta(milliseconds=1)) == (None, None)
    conn.execute("SET enable_seqscan = off")  # a table this small is read whole whenever it may be
    plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + ledger.UNEXPORTED + " WHERE b.sealed_at >= %s",
                                                    ("kafka", times[0])).fetchall())
    conn.execute("RESET enable_seqscan")
    assert "billing_ledger_sealed_at" in plan, plan

    await export_until_caught_up(exporter(bootstrap, export_db, KafkaSink(bootstrap, SOURCE, print)), conn)
    assert ledger.oldest_unexported(conn, "kafka") == (None, times[-1])
    assert ledger.oldest_unexported(conn, "kafka", times[3]) == (None, times[-1])
    assert ledger.oldest_unexported(conn, "openmeter", times[3]) == (times[3], times[-1])  # a sink of its own
