"""How the chaos run's clients reach the gateways, and what their requests got: availability.

A client talks to one gateway and moves to the next when that one refuses the connection (it was killed):
a connection that was never made carried no request, so, like a load balancer trying its next backend, the
client retries at once elsewhere; that is counted under `failovers`, not as a request.

Every request a client makes is tallied by kind: `admission` (POST /v1/generations), `attach` (GET
.../events, first attach or resume) and `status` (GET /v1/generations/{id}). Its outcome is

    answered   a success, or an answer the API documents for a passing condition that a client retries
               (429 / 503 with Retry-After; 504 when the decision took longer than the admission timeout)
    failed     any other status (a 401 for a valid key, a 404 for the caller's own generation, 5xx) or no
               answer at all (the connection broke or timed out before the response's status line)

A stream that was answered (200) and then cut, because its gateway died, is an answered attach; its resume
is the next request. Cuts are counted apart (`streams_cut`).
availability_error_fraction = failed / requests, over the whole run; `failed_after_fault` puts each failed
request under the last fault that had begun when it failed (`before_faults` if none had).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx

RETRY_LATER = {429, 503, 504}
SUCCESS = {"admission": {200, 201}, "attach": {200, 204}, "status": {200}}


@dataclass
class Availability:
    requests: Counter = field(default_factory=Counter)  # kind -> requests made
    failed: Counter = field(default_factory=Counter)  # "kind what" -> failed requests
    retry_later: Counter = field(default_factory=Counter)  # "kind status" -> documented 429/503/504 answers
    failovers: int = 0
    streams_cut: int = 0
    failed_at: list[float] = field(default_factory=list)  # monotonic instant of each failed request

    def answered(self, kind: str, status: int) -> None:
        self.requests[kind] += 1
        if status in RETRY_LATER:
            self.retry_later[f"{kind} {status}"] += 1
        elif status not in SUCCESS[kind]:
            self._fail(f"{kind} HTTP {status}")

    def no_answer(self, kind: str, error: Exception) -> None:
        self.requests[kind] += 1
        self._fail(f"{kind} {type(error).__name__}")

    def _fail(self, what: str) -> None:
        self.failed[what] += 1
        self.failed_at.append(time.monotonic())

    def report(self, faults: list[dict] = (), began: float = 0.0) -> dict:
        """The tally; `faults` (each with `fault` and `began_s` on the clock that started at `began`) attribute
        every failed request to the fault in effect."""
        total = sum(self.requests.values())
        failed = sum(self.failed.values())
        return {"availability_error_fraction": round(failed / total, 6) if total else 0.0,
                "requests": total, "failed": failed, "requests_by_kind": dict(self.requests),
                "failed_by_kind": dict(self.failed), "failed_after_fault": self._by_fault(faults, began),
                "retry_later": dict(self.retry_later), "failovers": self.failovers, "streams_cut": self.streams_cut}

    def _by_fault(self, faults: list[dict], began: float) -> dict[str, int]:
        counts: Counter = Counter()
        for at in self.failed_at:
            started = [f["fault"] for f in faults if f["began_s"] <= at - began]
            counts[started[-1] if started else "before_faults"] += 1
        return dict(counts)


class GatewayRoute:
    """One client's way to the gateways: its current one, and the others in turn when that one is down."""

    def __init__(self, gateways: list[httpx.AsyncClient], first: int, tally: Availability) -> None:
        self.gateways, self.current, self.tally = gateways, first % len(gateways), tally

    @property
    def http(self) -> httpx.AsyncClient:
        return self.gateways[self.current]

    def _fail_over(self) -> None:
        self.tally.failovers += 1
        self.current = (self.current + 1) % len(self.gateways)

    async def request(self, kind: str, method: str, url: str, **kwargs) -> httpx.Response:
        """The response (tallied), or the httpx error when no gateway answered."""
        for tries_left in range(len(self.gateways), 0, -1):
            try:
                response = await self.http.request(method, url, **kwargs)
            except httpx.ConnectError as exc:
                if tries_left > 1:
                    self._fail_over()
                    continue
                self.tally.no_answer(kind, exc)
                raise
            except httpx.HTTPError as exc:
                self.tally.no_answer(kind, exc)
                self._fail_over()  # a gateway that dies with the request in flight; the retry goes elsewhere
                raise
            self.tally.answered(kind, response.status_code)
            return response
        raise AssertionError("unreachable: the last try returns or raises")

    @asynccontextmanager
    async def stream(self, url: str, **kwargs) -> AsyncIterator[httpx.Response]:
        """A streamed GET (an attach). An error before the status line is a failed request; one after it
        (the stream cut) is counted under `streams_cut`, and the next attach goes to another gateway."""
        for tries_left in range(len(self.gateways), 0, -1):
            request = self.http.build_request("GET", url, **kwargs)
            try:
                response = await self.http.send(request, stream=True)
            except httpx.ConnectError as exc:
                if tries_left > 1:
                    self._fail_over()
                    continue
                self.tally.no_answer("attach", exc)
                raise
            except httpx.HTTPError as exc:
                self.tally.no_answer("attach", exc)
                self._fail_over()
                raise
            break
        self.tally.answered("attach", response.status_code)
        try:
            yield response
        except httpx.HTTPError:
            self.tally.streams_cut += 1
            self._fail_over()
            raise
        finally:
            await response.aclose()
