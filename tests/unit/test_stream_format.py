"""The hand-formatted JSON of token events is exactly what json.dumps writes for the same data."""
from __future__ import annotations

import json

import pytest

from producers.gateway.streams import sse, token_event


@pytest.mark.parametrize("text", ["", "plain", 'quote " and \\ backslash', "line\nbreak\ttab", "héllo 😀 東京",
                                  "\u0000\u001f control", "a, b, [c], {d}: e"])
def test_token_event_json_matches_json_dumps(text):
    event = token_event('gen-"1', 2, 7, (0, 511, 12), text, 9)
    assert event.encoded == json.dumps(event.data, separators=(",", ":"))
    assert json.loads(event.encoded)["textDelta"] == text
    assert sse(event.kind, event.data, event.seq, event.encoded) == sse(event.kind, event.data, event.seq)
