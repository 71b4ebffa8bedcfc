"""One HTTP request to a billing system, its answer classified (sinks/base.py)."""
from __future__ import annotations

import httpx

from projections.export.sinks.base import SinkRefused, SinkUnavailable

RETRIED = {408, 425, 429}
REASON_CHARS = 300  # a sink's error body names fields and ids; kept short in the ledger and the DLQ


def client(base_url: str, headers: dict[str, str], timeout_s: float = 30.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s)


async def post(http: httpx.AsyncClient, path: str, **request) -> httpx.Response:
    """POST and return a 2xx answer; raise SinkUnavailable (retry) or SinkRefused (dead-letter)."""
    try:
        response = await http.post(path, **request)
    except httpx.HTTPError as exc:
        raise SinkUnavailable(f"{type(exc).__name__} on {path}") from None
    if response.is_success:
        return response
    reason = f"HTTP {response.status_code} on {path}: {response.text[:REASON_CHARS]}"
    if response.status_code in RETRIED or response.status_code >= 500:
        raise SinkUnavailable(reason, retry_after_s(response))
    raise SinkRefused(reason)


def retry_after_s(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None  # absent, or an HTTP date: our own backoff
