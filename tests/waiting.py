"""Waiting in tests: on a condition, with a deadline, never on a fixed sleep (docs/style.md, rule 7).

    value = await wait_until(predicate, timeout_s, what="the worker live")      # in async tests
    value = wait_until_sync(predicate, timeout_s, what="the stack up")          # in sync tests
    await holds_for(predicate, duration_s, what="the late token refused")       # nothing happens for a while

`predicate()` is asked at once, then every `step_s` until `timeout_s` has passed, and once more at the deadline;
its first accepted value is returned (accepted: truthy, or what `accept(value)` says). In `wait_until` it may
return an awaitable (an async function: an HTTP call, a query), which is awaited. Past the deadline: an
AssertionError naming `what`, a string or a function of the last value (so the message can show the last
answer). An exception the predicate raises ends the wait at once (assert inside it what must hold meanwhile,
e.g. that a process still runs); catch inside it what only means "not yet".

`holds_for` is the one wait that is a span of time by nature: that something does not happen (a late record
refused, nothing more written) can only be seen by watching for a while. The predicate must hold when asked at
once, every `step_s` and at the end of `duration_s`.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

What = str | Callable[[Any], str]


def _said(what: What, last: Any) -> str:
    return what(last) if callable(what) else what


async def _ask(predicate: Callable[[], Any]) -> Any:
    value = predicate()
    return await value if inspect.isawaitable(value) else value


async def wait_until(predicate: Callable[[], Any], timeout_s: float, what: What = "condition", *,
                     step_s: float = 0.02, accept: Callable[[Any], bool] = bool) -> Any:
    deadline = time.monotonic() + timeout_s
    while not accept(value := await _ask(predicate)):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {_said(what, value)}")
        await asyncio.sleep(min(step_s, max(0.0, deadline - time.monotonic())))
    return value


def wait_until_sync(predicate: Callable[[], Any], timeout_s: float, what: What = "condition", *,
                    step_s: float = 0.02, accept: Callable[[Any], bool] = bool) -> Any:
    deadline = time.monotonic() + timeout_s
    while not accept(value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {_said(what, value)}")
        time.sleep(min(step_s, max(0.0, deadline - time.monotonic())))
    return value


async def holds_for(predicate: Callable[[], Any], duration_s: float, what: What = "condition", *,
                    step_s: float = 0.02) -> None:
    end = time.monotonic() + duration_s
    while value := await _ask(predicate):
        if time.monotonic() >= end:
            return
        await asyncio.sleep(min(step_s, max(0.0, end - time.monotonic())))
    raise AssertionError(f"{_said(what, value)} stopped holding before {duration_s}s had passed")
