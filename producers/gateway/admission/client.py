"""Publish a command on `llm.commands` and await the controller's decision on `llm.replies`.

Replies are keyed by gateway id, so this gateway reads exactly one partition
of `llm.replies` (the one its id hashes to, as the Java partitioner places
it), from the end at start, and matches decisions to waiting calls by
correlation id. Other gateways' replies on the same partition are skipped.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client import Histogram

from plumbing.kafka.clients import Kafka, make_consumer, make_producer, publish
from plumbing.kafka.clients import partitions_of
from plumbing.kafka.follower import partition_for
from producers.gateway.admission.refusals import CapacityRefusals
from schemas.codec import DecodeError, decode
from schemas.commands import CancelGeneration, SubmitGeneration
from schemas.replies import AdmissionDecision
from schemas.topics import COMMANDS, REPLIES

log = logging.getLogger(__name__)


class AdmissionClient:
    def __init__(self, kafka: Kafka, controller_group: str, gateway_id: str | None = None,
                 latency: Histogram | None = None) -> None:
        self.kafka = kafka
        self.controller_group = controller_group
        self.gateway_id = gateway_id or f"gw-{uuid.uuid4().hex[:12]}"
        self.producer: AIOKafkaProducer | None = None  # made in start(): aiokafka needs the running loop
        self.consumer: AIOKafkaConsumer | None = None
        self.waiting: dict[str, asyncio.Future[AdmissionDecision]] = {}
        self._task: asyncio.Task | None = None
        self.latency = latency  # observes publish -> decision of every answered command
        self.refusals = CapacityRefusals()  # the controller's last no_capacity, repeated for a moment

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        # linger 0: a caller waits on every command, so there is nothing to gain by holding it back
        self.producer = make_producer(self.kafka, client_id=self.gateway_id, linger_ms=0)
        self.consumer = make_consumer(self.kafka, client_id=self.gateway_id, auto_offset_reset="latest")
        await self.producer.start()
        await self.consumer.start()
        partitions = await partitions_of(self.consumer, REPLIES)
        tp = partitions[partition_for(self.gateway_id, len(partitions))]
        self.consumer.assign([tp])
        await self.consumer.seek_to_end(tp)
        await self.consumer.position(tp)
        self._task = asyncio.create_task(self._read_replies(), name="gateway-replies")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.consumer.stop()
        await self.producer.stop()

    async def _read_replies(self) -> None:
        while True:
            for records in (await self.consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    try:
                        reply = decode(REPLIES, record.value)
                    except DecodeError as exc:
                        log.warning("undecodable reply offset=%d error=%s", record.offset, type(exc).__name__)
                        continue
                    if reply.gateway_id != self.gateway_id or reply.decided_by not in (None, self.controller_group):
                        continue
                    future = self.waiting.pop(reply.correlation_id, None)
                    if future is not None and not future.done():
                        future.set_result(reply)

    def correlation_id(self) -> str:
        return uuid.uuid4().hex

    async def decide(self, command: SubmitGeneration | CancelGeneration, timeout_s: float,
                     timing: list[float] | None = None) -> AdmissionDecision | None:
        """The decision for `command`, or None when none arrived within `timeout_s`; `timing` gets the ms spent
        publishing the command and then awaiting the reply."""
        future = asyncio.get_running_loop().create_future()
        self.waiting[command.correlation_id] = future
        try:
            started = time.perf_counter()
            await publish(self.producer, COMMANDS, command)
            published = time.perf_counter()
            decision = await asyncio.wait_for(future, timeout_s)
            if timing is not None:
                timing.extend(((published - started) * 1000, (time.perf_counter() - published) * 1000))
            if self.latency is not None:
                self.latency.observe(time.perf_counter() - started)
            return decision
        except asyncio.TimeoutError:
            return None
        finally:
            self.waiting.pop(command.correlation_id, None)
