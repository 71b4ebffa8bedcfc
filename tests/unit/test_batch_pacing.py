"""A gateway hands batch requests to the controller at a bounded rate, tenants in turn (admission/pacing.py)."""
from __future__ import annotations

import asyncio

from producers.gateway.admission.pacing import BatchPacer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_quiet_gateway_hands_on_a_burst_at_once_and_paces_the_rest():
    clock = Clock()
    pacer = BatchPacer(rate_per_s=8.0, burst=3, clock=clock)
    for _ in range(3):
        await asyncio.wait_for(pacer.turn("acme"), 1)  # within the burst: no wait
    fourth, fifth = (asyncio.create_task(pacer.turn("acme")) for _ in range(2))
    await settle()
    assert not fourth.done() and pacer.queued == 2 and pacer.timer is not None
    clock.now += 0.125  # one request's worth of time at 8 a second
    pacer._release()
    await settle()
    assert fourth.done() and not fifth.done() and pacer.queued == 1
    clock.now += 0.125
    pacer._release()
    await settle()
    assert fifth.done() and pacer.queued == 0 and pacer.timer is None


async def test_tenants_take_turns_so_one_burst_delays_another_tenant_by_a_turn():
    clock = Clock()
    pacer = BatchPacer(rate_per_s=1.0, burst=2, clock=clock)
    await pacer.turn("big")
    await pacer.turn("big")
    big = [asyncio.create_task(pacer.turn("big")) for _ in range(5)]
    await settle()
    small = asyncio.create_task(pacer.turn("small"))
    await settle()
    clock.now += 2.0  # two turns
    pacer._release()
    await settle()
    assert [t.done() for t in big] == [True, False, False, False, False] and small.done()
    for task in big:
        task.cancel()


async def test_a_request_whose_client_left_gives_its_turn_to_the_next():
    clock = Clock()
    pacer = BatchPacer(rate_per_s=1.0, burst=1, clock=clock)
    await pacer.turn("acme")
    gone, next_one = asyncio.create_task(pacer.turn("acme")), asyncio.create_task(pacer.turn("acme"))
    await settle()
    gone.cancel()
    await settle()
    clock.now += 1.0  # one turn: it goes to the request still waiting
    pacer._release()
    await settle()
    assert gone.cancelled() and next_one.done() and pacer.queued == 0


async def test_no_rate_means_no_pacing():
    pacer = BatchPacer(rate_per_s=0.0, burst=1)
    for _ in range(100):
        await asyncio.wait_for(pacer.turn("acme"), 1)
    assert pacer.queued == 0
