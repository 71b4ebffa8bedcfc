"""The hand-formatted JSON of token events is exactly what json.dumps writes for the same data; a stream whose
source the database fails ends with that error event."""
from __future__ import annotations

import json

import pytest

from producers.gateway.streams.events import sse, token_event


@pytest.mark.parametrize("text", ["", "plain", 'quote " and \\ backslash', "line\nbreak\ttab", "héllo 😀 東京",
                                  "\u0000\u001f control", "a, b, [c], {d}: e"])
def test_token_event_json_matches_json_dumps(text):
    event = token_event('gen-"1', 2, 7, (0, 511, 12), text, 9)
    assert event.encoded == json.dumps(event.data, separators=(",", ":"))
    assert json.loads(event.encoded)["textDelta"] == text
    assert sse(event.kind, event.data, event.seq, event.encoded) == sse(event.kind, event.data, event.seq)


async def test_a_source_the_database_fails_ends_the_stream_with_its_code_and_retry_after_not_internal():
    from producers.gateway.errors import DatabaseUnavailable
    from producers.gateway.streams.delivery import BoundedDelivery

    async def source():
        yield token_event("gen-1", 1, 1, (5,), "a", 1)
        raise DatabaseUnavailable("OperationalError", 1500)  # the resume buffer's next read

    delivery = BoundedDelivery(source(), limit=8, after=0, generation_id="gen-1")
    events = [event async for event in delivery.events()]
    assert [(e.kind, e.seq) for e in events] == [("token", 1), ("error", None)]
    assert events[1].data == {"code": "database_unavailable", "message": "the database is unavailable; retry later",
                              "details": {"error": "OperationalError", "retryAfterMs": 1500}}
