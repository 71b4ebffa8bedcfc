"""The gateway holds the controller's no_capacity for a moment: refused requests wait it out and are answered
503 without a command (a client that ignores Retry-After must not make every refusal a controller transaction,
nor a refusal loop that spins on the engine's cores)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from producers.gateway.admission.refusals import HOLD_S, CapacityRefusals
from producers.gateway.admission.submit import repeat_capacity_refusal
from producers.gateway.database import Principal
from producers.gateway.errors import ApiError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_no_capacity_holds_for_its_retry_after_at_most_half_a_second_per_model_and_tier():
    clock = Clock()
    refusals = CapacityRefusals(clock)
    assert refusals.observe("m@1", "interactive", "no_capacity", 300) == pytest.approx(0.3)  # the tarpit
    assert refusals.held("m@1", "interactive") == (pytest.approx(0.3), 1)
    assert refusals.held("m@1", "batch") is None and refusals.held("other@1", "interactive") is None
    clock.now += 0.2
    assert refusals.held("m@1", "interactive")[0] == pytest.approx(0.1)
    clock.now += 0.1
    assert refusals.held("m@1", "interactive") is None  # the hold is over: ask the controller
    # a long Retry-After is held only HOLD_S here, and the rest of it is what the repeat says
    assert refusals.observe("m@1", "interactive", "no_capacity", 7000) == HOLD_S
    assert refusals.held("m@1", "interactive") == (pytest.approx(HOLD_S), round((7 - HOLD_S) * 1000))
    refusals.admitted("m@1", "interactive")  # another request got in: room again
    assert refusals.held("m@1", "interactive") is None
    assert refusals.observe("m@1", "interactive", "concurrency", 1000) == 0  # a tenant's budget: not capacity
    assert refusals.observe("m@1", "interactive", "no_capacity", None) == 0
    assert refusals.held("m@1", "interactive") is None and refusals.repeated == 3


def gateway_with(refusals: CapacityRefusals, known: set[str]):
    counted = []
    return SimpleNamespace(admission=SimpleNamespace(refusals=refusals),
                           bridge=SimpleNamespace(knows_request=lambda tenant, request_id: request_id in known),
                           metrics=SimpleNamespace(repeated_refusals=SimpleNamespace(inc=lambda: counted.append(1)))
                           ), counted


async def test_a_held_request_waits_out_the_hold_and_gets_503_but_a_known_request_goes_through():
    refusals = CapacityRefusals()
    gateway, counted = gateway_with(refusals, known={"seen"})
    principal = Principal("t1", 1000, 1000)
    body = SimpleNamespace(model="m@1", tier="interactive", request_id="new")
    await repeat_capacity_refusal(gateway, principal, body)  # nothing held: the controller decides
    refusals.observe("m@1", "interactive", "no_capacity", 1200)
    began = time.monotonic()
    with pytest.raises(ApiError) as refused:
        await repeat_capacity_refusal(gateway, principal, body)
    assert time.monotonic() - began >= HOLD_S * 0.9  # answered once the hold is over, not at once
    assert (refused.value.status, refused.value.code) == (503, "no_capacity")
    assert 650 <= refused.value.retry_after_ms <= 700 and refused.value.details == {"requestId": "new"}
    assert counted == [1]
    refusals.observe("m@1", "interactive", "no_capacity", 1200)
    await repeat_capacity_refusal(gateway, principal, SimpleNamespace(model="m@1", tier="interactive",
                                                                      request_id="seen"))
    assert counted == [1]
