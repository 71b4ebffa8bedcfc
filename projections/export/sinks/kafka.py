"""`llm.usage-export`: each seal as a CloudEvents structured JSON record (key: the tenant), written by an
idempotent producer and acknowledged by every in-sync replica before the ledger records it."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from aiokafka.errors import KafkaError

from plumbing.kafka.clients import Kafka, make_producer
from projections.export.ledger import Outcome
from projections.export.records import Export
from projections.export.sinks.base import Backoff, SinkUnavailable, until_answered
from schemas.codec import encode, record_key
from schemas.topics import USAGE_EXPORT

# The CloudEvents Kafka binding's structured mode: the whole event is the value, and this header says so.
HEADERS = [("content-type", b"application/cloudevents+json")]


class KafkaSink:
    name = "kafka"

    def __init__(self, kafka: Kafka, source: str, on_retry: Callable[[str], None],
                 backoff: Backoff = Backoff()) -> None:
        self.producer = make_producer(kafka, client_id="ledgerlm-export")
        self.source, self.on_retry, self.backoff = source, on_retry, backoff

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    async def send(self, export: Export) -> None:
        event = export.seal.cloudevent(self.source)
        await self.producer.send_and_wait(USAGE_EXPORT, value=encode(event), key=record_key(USAGE_EXPORT, event),
                                          headers=HEADERS)

    async def deliver(self, exports: Sequence[Export], stop: asyncio.Event) -> list[Outcome]:
        async def send_all() -> None:
            try:
                await asyncio.gather(*(self.send(x) for x in exports))
            except KafkaError as exc:
                raise SinkUnavailable(type(exc).__name__) from None

        await until_answered(send_all, stop, self.backoff, self.on_retry, f"kafka batch of {len(exports)}")
        return [Outcome(x.seal) for x in exports]
