"""The pieces of `ledgerlm export` that need no broker: the usage CloudEvent, Stripe identifiers, how an HTTP
answer is classified, and how a refused batch is narrowed to the events the sink refuses."""
from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx
import pytest
from cloudevents.core.formats.json import JSONFormat

from ledgerlm.cli.export_cmd import SINK_NAMES
from projections.export.records import Export, Seal
from projections.export.sinks import http
from projections.export.sinks.base import SinkRefused, SinkUnavailable, bisecting
from projections.export.sinks.factory import SINKS
from projections.export.sinks.stripe import MAX_IDENTIFIER, StripeSink, identifier
from schemas.codec import encode
from schemas.values import BillingIds

SEALED_AT = datetime(2026, 11, 30, 23, 59, 59, 250000, tzinfo=UTC)


def make_seal(generation_id: str = "gen_abc", epoch: int = 2, cached: int = 0) -> Seal:
    return Seal(generation_id, "acme", epoch, "smollm2@1", "completed", "final", 120, cached, 30, SEALED_AT)


def test_a_seal_is_a_cloudevent_the_sdk_reads_back():
    event = JSONFormat().read(None, encode(make_seal().cloudevent("ledgerlm")))
    assert (event.get_id(), event.get_source(), event.get_type(), event.get_subject(), event.get_time()) == (
        "usage:gen_abc:2", "ledgerlm", "io.ledgerlm.usage.sealed", "acme", SEALED_AT)
    assert event.get_data() == {"generation_id": "gen_abc", "epoch": 2, "model": "smollm2@1", "label": "final",
                                "end_reason": "completed", "input_tokens": 120, "cached_input_tokens": 0,
                                "output_tokens": 30}


def test_a_generation_sealed_before_any_attempt_is_epoch_0():
    assert make_seal(epoch=0).record_id == "usage:gen_abc:0"


def test_stripe_identifiers_fit_100_characters_and_stay_the_same():
    short = identifier("usage:gen_abc:2", "cached_input")
    long_id = "usage:" + "g" * 128 + ":3"
    assert short == "usage:gen_abc:2:cached_input"
    assert len(identifier(long_id, "cached_input")) <= MAX_IDENTIFIER
    assert identifier(long_id, "input") == identifier(long_id, "input") != identifier(long_id, "output")


def test_stripe_sends_no_event_for_a_meter_at_zero():
    sink = StripeSink("http://x", None, {"input": "in", "cached_input": "cached", "output": "out"}, print)
    forms = sink.meter_events(Export(make_seal(cached=0), BillingIds(stripe_customer_id="cus_1")))
    assert [(f["event_name"], f["payload[value]"], f["timestamp"]) for f in forms] == [
        ("in", "120", str(int(SEALED_AT.timestamp()))), ("out", "30", str(int(SEALED_AT.timestamp())))]


@pytest.mark.parametrize(("status", "headers", "kind", "retry_after"), [
    (429, {"Retry-After": "3"}, SinkUnavailable, 3.0), (503, {}, SinkUnavailable, None),
    (408, {}, SinkUnavailable, None), (400, {}, SinkRefused, None), (422, {}, SinkRefused, None)])
def test_answers_are_retried_or_refused(status, headers, kind, retry_after):
    transport = httpx.MockTransport(lambda request: httpx.Response(status, headers=headers, text="nope"))

    async def call():
        async with httpx.AsyncClient(base_url="http://sink", transport=transport) as client:
            await http.post(client, "/events", json=[])

    with pytest.raises(kind) as raised:
        asyncio.run(call())
    assert raised.value.reason == f"HTTP {status} on /events: nope"
    if kind is SinkUnavailable:
        assert raised.value.retry_after == retry_after


def test_a_refused_batch_is_halved_down_to_the_refused_events():
    exports = [Export(make_seal(f"gen_{i}"), BillingIds()) for i in range(8)]
    bad = {"gen_2", "gen_5"}
    sent = []

    async def send_batch(batch):
        sent.append(len(batch))
        if {x.seal.generation_id for x in batch} & bad:
            raise SinkRefused("HTTP 400: bad event")

    outcomes = asyncio.run(bisecting(send_batch, exports))
    assert [(o.seal.generation_id, o.reason) for o in outcomes] == [
        (f"gen_{i}", "HTTP 400: bad event" if f"gen_{i}" in bad else None) for i in range(8)]
    assert sent == [8, 4, 2, 2, 1, 1, 4, 2, 1, 1, 2]  # the good halves go once, whole


def test_the_cli_offers_every_sink_the_factory_builds():
    assert SINK_NAMES == SINKS


def test_the_unexported_floor_starts_each_measure_at_the_oldest_unexported_less_a_skew_and_rereads_all_at_times():
    from datetime import timedelta

    from projections.export.ledger import UnexportedFloor

    t = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    floor = UnexportedFloor(skew=timedelta(minutes=5), full_every=3)
    assert floor.since() is None  # nothing measured yet: the whole ledger
    floor.observe(None, None)  # an empty ledger
    assert floor.since() is None
    floor.observe(t, t + timedelta(hours=1))  # an unexported seal at t
    assert floor.since() == t - timedelta(minutes=5)
    floor.observe(None, t + timedelta(hours=2))  # all exported since: the newest seal is the floor
    assert floor.since() is None  # the third measure reads everything again
    floor.observe(None, None)  # nothing sealed in the range: the floor stays
    assert floor.since() == t + timedelta(hours=2) - timedelta(minutes=5)
