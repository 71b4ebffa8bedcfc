"""A day of traffic for the audit bench, written as the stand-in worker writes: record batches per partition.

Per generation: Admitted, AttemptStarted, a UsageReported every 16 tokens and Completed on llm.generations;
`tokens` TokensEmitted (one token each; a few deltas carry NUL and other control characters, as a byte-level
model emits them) and StreamFinished on llm.tokens. Events are built without re-validation
(`model_construct`: valid by construction) so writing them costs little next to what is measured.
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaProducer

from plumbing.kafka.clients import Kafka, make_producer
from plumbing.kafka.follower import partition_for
from schemas.codec import encode, record_headers, record_key
from schemas.lifecycle import Admitted, AttemptStarted, Completed, UsageReported
from schemas.stream import StreamFinished, TokensEmitted
from schemas.topics import GENERATIONS, TOKENS
from schemas.values import Usage

HASH = "ad" * 32
REPORT_EVERY = 16
DELTAS = ("the", " water", " is", "\u0000", " warm", "\x07\x1b[0m", "\ufffd", " \U0001f30a")


class BatchWriter:
    """Appends records to one open batch per (topic, partition); a full batch is sent at once."""

    def __init__(self, producer: AIOKafkaProducer, partitions: dict[str, int]) -> None:
        self.producer, self.partitions = producer, partitions
        self.open: dict[tuple[str, int], object] = {}
        self.futures: list = []
        self.records = 0

    async def append(self, topic: str, event) -> None:
        partition = partition_for(str(event.generation_id), self.partitions[topic])
        record = dict(key=record_key(topic, event), value=encode(event), timestamp=None,
                      headers=record_headers(event))
        batch = self.open.setdefault((topic, partition), self.producer.create_batch())
        if batch.append(**record) is None:
            self.futures.append(await self.producer.send_batch(batch, topic, partition=partition))
            batch = self.open[(topic, partition)] = self.producer.create_batch()
            batch.append(**record)
        self.records += 1

    async def flush(self) -> None:
        for (topic, partition), batch in self.open.items():
            self.futures.append(await self.producer.send_batch(batch, topic, partition=partition))
        self.open.clear()
        await self.producer.flush()
        for future in self.futures:
            await future
        self.futures.clear()


def generation_events(tenant: str, tokens: int, clock: datetime) -> tuple[list, list]:
    """(lifecycle events, stream events) of one completed generation."""
    gid = f"bench-{uuid.uuid4().hex[:12]}"
    scope = {"tenant_id": tenant, "generation_id": gid}
    at = iter(clock + timedelta(milliseconds=i) for i in range(10 * tokens))
    life = [Admitted.model_construct(type="Admitted", **scope, epoch=1, request_id=gid, model_version="bench@1",
                                     input_tokens=64, max_output_tokens=tokens, reserved_tokens=64 + tokens,
                                     payload_hash=HASH, occurred_at=next(at)),
            AttemptStarted.model_construct(type="AttemptStarted", **scope, epoch=1, worker_id="bench-worker",
                                           occurred_at=next(at))]
    stream = []
    for seq in range(1, tokens + 1):
        stream.append(TokensEmitted.model_construct(
            type="TokensEmitted", **scope, epoch=1, seq=seq, token_ids=(seq % 500,),
            text_delta=DELTAS[seq % len(DELTAS)], token_count=seq, occurred_at=next(at)))
        if seq % REPORT_EVERY == 0:
            life.append(UsageReported.model_construct(
                type="UsageReported", **scope, epoch=1, report_seq=seq // REPORT_EVERY, occurred_at=next(at),
                usage=Usage(processed_input_tokens=64, generated_output_tokens=seq)))
    usage = Usage(processed_input_tokens=64, generated_output_tokens=tokens)
    life.append(Completed.model_construct(type="Completed", **scope, epoch=1, finish_reason="length", usage=usage,
                                          occurred_at=next(at)))
    stream.append(StreamFinished.model_construct(type="StreamFinished", **scope, epoch=1, seq=tokens + 1,
                                                 reason="output-limit", usage=usage, usage_label="final",
                                                 occurred_at=next(at)))
    return life, stream


async def write_traffic(kafka: Kafka, generations: int, tokens: int, tenant: str) -> int:
    """Write `generations` generations' events; the number of records written."""
    producer = make_producer(kafka, client_id="bench-audit-worker")
    await producer.start()
    try:
        partitions = {topic: len(await producer.partitions_for(topic)) for topic in (GENERATIONS, TOKENS)}
        writer = BatchWriter(producer, partitions)
        clock = datetime.now(UTC)
        for _ in range(generations):
            life, stream = generation_events(tenant, tokens, clock)
            for event in life:
                await writer.append(GENERATIONS, event)
            for event in stream:
                await writer.append(TOKENS, event)
        await writer.flush()
        return writer.records
    finally:
        await producer.stop()
