"""The tests' one way to wait (tests/waiting.py): on a condition, with a deadline."""
from __future__ import annotations

import time

import pytest

from tests.waiting import holds_for, wait_until, wait_until_sync


def counter(ready_at: int):
    asked = []

    def predicate():
        asked.append(len(asked) + 1)
        return asked[-1] if asked[-1] >= ready_at else 0

    return predicate, asked


async def test_wait_until_returns_the_first_accepted_value_and_awaits_an_async_predicate():
    predicate, asked = counter(3)
    assert await wait_until(predicate, 5, step_s=0) == 3 and asked == [1, 2, 3]

    async def answer():
        return {"status": 503}

    assert await wait_until(answer, 1, accept=lambda r: r["status"] == 503) == {"status": 503}


async def test_wait_until_asks_once_more_at_the_deadline_then_names_what_it_waited_for_with_the_last_value():
    asked = []
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0.1s waiting for the answer \(last (\d+)\)") as error:
        await wait_until(lambda: asked.append(time.monotonic()) or len(asked), 0.1, step_s=0.04,
                         accept=lambda count: count > 10**9, what=lambda last: f"the answer (last {last})")
    assert error.value.args[0].endswith(f"(last {len(asked)})") and len(asked) >= 2
    assert asked[-1] - started >= 0.1 and time.monotonic() - started < 1  # the last ask was at the deadline


async def test_an_error_of_the_predicate_ends_the_wait_at_once():
    def dead():
        raise AssertionError("the process exited")

    started = time.monotonic()
    with pytest.raises(AssertionError, match="the process exited"):
        await wait_until(dead, 10)
    assert time.monotonic() - started < 1


def test_wait_until_sync_waits_the_same_way():
    predicate, asked = counter(2)
    assert wait_until_sync(predicate, 5, step_s=0) == 2
    with pytest.raises(AssertionError, match="timed out after 0.05s waiting for the stack"):
        wait_until_sync(lambda: None, 0.05, what="the stack")


async def test_holds_for_watches_the_whole_span_and_fails_when_the_condition_stops_holding():
    started = time.monotonic()
    await holds_for(lambda: True, 0.1, step_s=0.02)
    assert time.monotonic() - started >= 0.1
    with pytest.raises(AssertionError, match="the late token refused stopped holding before 5s had passed"):
        await holds_for(lambda: time.monotonic() - started < 0.15, 5, what="the late token refused")
    assert time.monotonic() - started < 2
