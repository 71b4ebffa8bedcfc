"""OpenMeter's HTTP ingest: `POST /api/v1/events`, a JSON array of CloudEvents
(`application/cloudevents-batch+json`). OpenMeter deduplicates on (id, source)."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence

from projections.export.ledger import Outcome
from projections.export.records import Export
from projections.export.sinks import http
from projections.export.sinks.base import Backoff, bisecting, chunks, until_answered

BATCH_EVENTS = 100


class OpenMeterSink:
    name = "openmeter"

    def __init__(self, url: str, token: str | None, source: str, on_retry: Callable[[str], None],
                 backoff: Backoff = Backoff()) -> None:
        headers = {"Content-Type": "application/cloudevents-batch+json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.url, self.headers, self.source = url, headers, source
        self.on_retry, self.backoff = on_retry, backoff
        self.http = None

    async def start(self) -> None:
        self.http = http.client(self.url, self.headers)

    async def stop(self) -> None:
        await self.http.aclose()

    async def deliver(self, exports: Sequence[Export], stop: asyncio.Event) -> list[Outcome]:
        async def send_batch(batch: Sequence[Export]) -> None:
            body = json.dumps([x.seal.cloudevent(self.source).model_dump(mode="json") for x in batch]).encode()
            await until_answered(lambda: http.post(self.http, "/api/v1/events", content=body), stop,
                                 self.backoff, self.on_retry, f"openmeter batch of {len(batch)}")

        outcomes: list[Outcome] = []
        for batch in chunks(exports, BATCH_EVENTS):
            outcomes += await bisecting(send_batch, batch)
        return outcomes
