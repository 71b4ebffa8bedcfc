"""The disconnect grace across gateways: a generation is canceled only when no gateway has a watcher, and by
exactly one gateway (the one whose subscriber left last)."""
from __future__ import annotations

from datetime import UTC, datetime

from producers.gateway.streams.presence import Presence
from schemas.presence import WatchersChanged

GRACE = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def report(gateway_id: str, watchers: int, at: float, gen_id: str = "gen_1") -> WatchersChanged:
    return WatchersChanged(generation_id=gen_id, gateway_id=gateway_id, watchers=watchers,
                           occurred_at=datetime.fromtimestamp(at, UTC))


def drained(presence: Presence) -> list[tuple[str, int]]:
    changes = []
    while not presence.outbox.empty():
        change = presence.outbox.get_nowait()
        changes.append((change.gateway_id, change.watchers))
    return changes


def test_only_transitions_are_published():
    presence = Presence("gw-a", Clock())
    presence.attach("gen_1")
    presence.attach("gen_1")
    presence.detach("gen_1", ended=False)
    presence.detach("gen_1", ended=False)
    assert drained(presence) == [("gw-a", 1), ("gw-a", 0)]


def test_unwatched_everywhere_is_due_after_the_grace_once():
    clock = Clock()
    presence = Presence("gw-a", clock)
    presence.attach("gen_1")
    presence.detach("gen_1", ended=False)
    clock.now += GRACE - 0.1
    assert presence.due(GRACE) == []
    clock.now += 0.2
    assert presence.due(GRACE) == ["gen_1"] and presence.due(GRACE) == []


def test_a_client_that_reconnected_to_another_gateway_keeps_its_generation():
    clock = Clock()
    presence = Presence("gw-a", clock)
    presence.attach("gen_1")
    presence.detach("gen_1", ended=False)
    presence.observe(report("gw-b", 1, clock.now + 0.5))  # the client's reconnect, on gateway B
    clock.now += GRACE * 3
    assert presence.due(GRACE) == []


def test_the_gateway_whose_subscriber_left_last_decides_and_the_other_does_not():
    clock_a, clock_b = Clock(), Clock()
    a, b = Presence("gw-a", clock_a), Presence("gw-b", clock_b)
    a.attach("gen_1")
    a.detach("gen_1", ended=False)  # left A at t0 ...
    b.observe(report("gw-a", 0, clock_a.now))
    clock_b.now += 1.0
    b.attach("gen_1")
    a.observe(report("gw-b", 1, clock_b.now))
    b.detach("gen_1", ended=False)  # ... reconnected to B, and left B at t0 + 1
    a.observe(report("gw-b", 0, clock_b.now))
    clock_a.now += GRACE * 2
    clock_b.now += GRACE
    assert a.due(GRACE) == [] and b.due(GRACE) == ["gen_1"]


def test_its_own_records_coming_back_change_nothing():
    clock = Clock()
    presence = Presence("gw-a", clock)
    presence.attach("gen_1")
    presence.detach("gen_1", ended=False)
    presence.observe(report("gw-a", 1, clock.now + 1))
    clock.now += GRACE
    assert presence.due(GRACE) == ["gen_1"]
