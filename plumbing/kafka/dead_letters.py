"""Decode-or-divert: a record that fails to decode goes to `llm.dlq` and the consumer goes on."""
from __future__ import annotations

import base64
import logging

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from plumbing.kafka.clients import publish
from schemas.codec import DecodeError, decode
from schemas.dead_letter import DeadLetter
from schemas.envelope import Envelope
from schemas.topics import DLQ

log = logging.getLogger(__name__)


def dead_letter_for(record: ConsumerRecord, error: DecodeError) -> DeadLetter:
    return DeadLetter(
        source_topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key_b64=base64.b64encode(record.key).decode() if record.key is not None else None,
        error_class=type(error).__name__,
        reason=error.reason,
        payload_b64=base64.b64encode(record.value or b"").decode(),
    )


class DeadLetterRouter:
    """Decodes records; undecodable ones are published to the DLQ (acknowledged) before moving on."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer

    async def decode_or_divert(self, record: ConsumerRecord) -> Envelope | None:
        try:
            return decode(record.topic, record.value)
        except DecodeError as exc:
            letter = dead_letter_for(record, exc)
            await publish(self.producer, DLQ, letter)
            log.warning("dead-lettered record topic=%s partition=%d offset=%d error=%s bytes=%d",
                        record.topic, record.partition, record.offset, type(exc).__name__,
                        len(record.value or b""))
            return None

    async def refused_by_projection(self, tp: TopicPartition, offset: int, event: Envelope, reason: str,
                                    key: bytes | None = None) -> None:
        """A well-formed event a projection could not accept (a constraint of the read model), with its record's key.

        Its signature is the projector's `reject` callback, so a router can be handed over as is."""
        letter = DeadLetter(source_topic=tp.topic, partition=tp.partition, offset=offset,
                            key_b64=base64.b64encode(key).decode() if key is not None else None,
                            error_class="ProjectionRefused", reason=reason,
                            payload_b64=base64.b64encode(event.model_dump_json().encode()).decode())
        await publish(self.producer, DLQ, letter)
