"""Lago: `POST /api/v1/events/batch` with `{"events": [...]}`; Lago keeps one event per `transaction_id`
(the usage id) and subscription. The subscription is the tenant's `lago_subscription_id`, or its id."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from projections.export.ledger import Outcome
from projections.export.records import Export
from projections.export.sinks import http
from projections.export.sinks.base import Backoff, bisecting, chunks, until_answered

BATCH_EVENTS = 100  # Lago's batch limit


class LagoSink:
    name = "lago"

    def __init__(self, url: str, api_key: str | None, metric_code: str, on_retry: Callable[[str], None],
                 backoff: Backoff = Backoff()) -> None:
        self.url, self.metric_code = url, metric_code
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.on_retry, self.backoff = on_retry, backoff
        self.http = None

    async def start(self) -> None:
        self.http = http.client(self.url, self.headers)

    async def stop(self) -> None:
        await self.http.aclose()

    def event(self, export: Export) -> dict:
        seal = export.seal
        return {"transaction_id": seal.record_id,
                "external_subscription_id": export.billing.lago_subscription_id or seal.tenant_id,
                "code": self.metric_code, "timestamp": int(seal.sealed_at.timestamp()),
                "properties": {"model": seal.model_version, "label": seal.usage_label,
                               "input_tokens": seal.input_tokens, "cached_input_tokens": seal.cached_input_tokens,
                               "output_tokens": seal.output_tokens}}

    async def deliver(self, exports: Sequence[Export], stop: asyncio.Event) -> list[Outcome]:
        async def send_batch(batch: Sequence[Export]) -> None:
            body = {"events": [self.event(x) for x in batch]}
            await until_answered(lambda: http.post(self.http, "/api/v1/events/batch", json=body), stop,
                                 self.backoff, self.on_retry, f"lago batch of {len(batch)}")

        outcomes: list[Outcome] = []
        for batch in chunks(exports, BATCH_EVENTS):
            outcomes += await bisecting(send_batch, batch)
        return outcomes
