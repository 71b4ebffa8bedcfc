"""Kafka requests per second per role, from each role's `ledgerlm:kafka_requests_total{client,api}`.

Each role serves the counts of its own process's clients on its /metrics (plumbing/kafka/request_counts.py);
a phase's rate is the difference of two scrapes over the phase's wall time, summed per role and API.
"""
from __future__ import annotations

import re

import httpx

_LINE = re.compile(r'^ledgerlm:kafka_requests_total\{api="([^"]+)",client="[^"]*"\} ([0-9.e+]+)$')


def parse_requests(text: str) -> dict[str, float]:
    """Requests by API, summed over the process's clients."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if match := _LINE.match(line):
            out[match[1]] = out.get(match[1], 0.0) + float(match[2])
    return out


class KafkaRequestScraper:
    def __init__(self, metrics_urls: dict[str, str]) -> None:
        self.urls = metrics_urls  # role -> its /metrics

    async def sample(self) -> dict[str, dict[str, float] | None]:
        out: dict[str, dict[str, float] | None] = {}
        async with httpx.AsyncClient(timeout=5) as http:
            for role, url in self.urls.items():
                try:
                    out[role] = parse_requests((await http.get(url)).text)
                except httpx.HTTPError:
                    out[role] = None
        return out


def request_rates(before: dict, after: dict, wall_s: float) -> dict[str, dict[str, float] | None]:
    """Per role: requests/s per API (Fetch, Produce, Heartbeat, ...) and their total."""
    rates: dict[str, dict[str, float] | None] = {}
    for role, counts in after.items():
        first = before.get(role)
        if counts is None or first is None or wall_s <= 0:
            rates[role] = None
            continue
        per_api = {api: round((n - first.get(api, 0.0)) / wall_s, 2) for api, n in sorted(counts.items())}
        rates[role] = {**{api: r for api, r in per_api.items() if r}, "total": round(sum(per_api.values()), 2)}
    return rates
