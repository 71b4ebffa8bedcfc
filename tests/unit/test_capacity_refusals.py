"""The gateway repeats the controller's no_capacity for a moment instead of asking again (a client that ignores
Retry-After must not make every refusal a controller transaction)."""
from __future__ import annotations

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
    refusals.observe("m@1", "interactive", "no_capacity", 300)
    assert refusals.retry_after_ms("m@1", "interactive") == 300
    assert refusals.retry_after_ms("m@1", "batch") is None and refusals.retry_after_ms("other@1", "interactive") is None
    clock.now += 0.2
    assert refusals.retry_after_ms("m@1", "interactive") == 100
    clock.now += 0.1
    assert refusals.retry_after_ms("m@1", "interactive") is None  # the hold is over: ask the controller
    refusals.observe("m@1", "interactive", "no_capacity", 7000)  # a long Retry-After is held only HOLD_S here
    assert refusals.retry_after_ms("m@1", "interactive") == round(HOLD_S * 1000)
    refusals.admitted("m@1", "interactive")  # another request got in: room again
    assert refusals.retry_after_ms("m@1", "interactive") is None
    refusals.observe("m@1", "interactive", "concurrency", 1000)  # a tenant's budget says nothing of capacity
    refusals.observe("m@1", "interactive", "no_capacity", None)
    assert refusals.retry_after_ms("m@1", "interactive") is None and refusals.repeated == 3


def gateway_with(refusals: CapacityRefusals, known: set[str]):
    counted = []
    return SimpleNamespace(admission=SimpleNamespace(refusals=refusals),
                           bridge=SimpleNamespace(knows_request=lambda tenant, request_id: request_id in known),
                           metrics=SimpleNamespace(repeated_refusals=SimpleNamespace(inc=lambda: counted.append(1)))
                           ), counted


def test_the_gateway_answers_503_with_the_hold_left_but_lets_a_known_request_through():
    refusals = CapacityRefusals(Clock())
    gateway, counted = gateway_with(refusals, known={"seen"})
    principal = Principal("t1", 1000, 1000)
    body = SimpleNamespace(model="m@1", tier="interactive", request_id="new")
    repeat_capacity_refusal(gateway, principal, body)  # nothing held: the controller decides
    refusals.observe("m@1", "interactive", "no_capacity", 400)
    with pytest.raises(ApiError) as refused:
        repeat_capacity_refusal(gateway, principal, body)
    assert (refused.value.status, refused.value.code, refused.value.retry_after_ms) == (503, "no_capacity", 400)
    assert refused.value.details == {"requestId": "new"} and counted == [1]
    repeat_capacity_refusal(gateway, principal, SimpleNamespace(model="m@1", tier="interactive", request_id="seen"))
    assert counted == [1]
