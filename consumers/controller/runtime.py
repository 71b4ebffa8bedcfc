"""The controller process: `llm.commands` in a consumer group, one Kafka transaction per batch.

    assignment of commands[p] ─▶ rebuild PartitionState from control-changelog[p]
                              └▶ transactional producer "<group>-p<p>" (init fences any previous owner)
    batch of commands[p] ─▶ Decider ─▶ one transaction: lifecycle + dispatch + replies + changelog[p]
                                                       + consumed offsets of commands[p]
    every lease_check_interval ─▶ Interrupted for attempts their workers lost (leases.py), tombstones
                                  for identities past identity_ttl_s, and held batch work handed to workers
                                  with room (or expired past its window), per partition, transactional

State is mutated before the commit; if a transaction fails the process stops
(rather than continue with state the log does not hold), and the next owner
rebuilds from the committed changelog and re-reads the uncommitted commands.
"""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from consumers.controller.decisions import Decider
from consumers.controller.effects import Effects
from consumers.controller.registry import WorkerRegistry
from consumers.controller.state import PartitionState
from plumbing.kafka.clients import Kafka, make_consumer, make_producer, read_to_end
from plumbing.kafka.dead_letters import dead_letter_for
from plumbing.kafka.follower import Follower, ReadThrough
from plumbing.settings import Settings
from plumbing.telemetry.metrics import ControllerMetrics
from plumbing.telemetry.server import Readiness, RoleServer
from schemas.codec import DecodeError, decode, encode, record_headers, record_key
from schemas.commands import AttemptRefused, CancelGeneration, ReleaseReservation, SubmitGeneration
from schemas.dead_letter import DeadLetter
from schemas.envelope import Envelope
from schemas.model_book import ModelBook
from schemas.registry_events import TenantRegistered, WorkerHeartbeat
from schemas.topics import COMMANDS, CONTROL_CHANGELOG, DISPATCH, DLQ, GENERATIONS, MODELS, REPLIES, TENANTS, WORKERS

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, controller: "Controller") -> None:
        self.controller = controller

    async def on_partitions_revoked(self, revoked):
        await self.controller.release_partitions([tp.partition for tp in revoked])

    async def on_partitions_assigned(self, assigned):
        await self.controller.own_partitions([tp.partition for tp in assigned])


class Controller:
    def __init__(self, settings: Settings, kafka: Kafka) -> None:
        self.settings = settings
        self.kafka = kafka
        self.group = settings.controller_group
        self.registry = WorkerRegistry()
        self.tenants: dict = {}
        self.models = ModelBook()
        self.decider = Decider(settings, self.registry, self.tenants, self.models)
        self.states: dict[int, PartitionState] = {}
        self.producers: dict[int, AIOKafkaProducer] = {}
        self.lock = asyncio.Lock()
        self.ready = asyncio.Event()
        self.decisions = 0
        self.stats = {"batches": 0, "records": 0, "txn_ms_total": 0.0, "txn_ms_max": 0.0}
        self.registry_caught_up = False
        # How far each owned commands partition has been read: a worker's release may wait there for us.
        self.commands_read = ReadThrough()
        self.metrics = ControllerMetrics(lambda: len(self.states), self.live_workers)
        self.http = RoleServer("controller", self.metrics.registry, self.readiness, settings.metrics_host,
                               settings.controller_metrics_port)

    def live_workers(self) -> int:
        now = time.time()
        return sum(1 for worker_id in list(self.registry.workers) if self.registry.is_live(worker_id, now))

    def readiness(self) -> Readiness:
        """Ready: the worker/tenant/model registry caught up and this member owns (and rebuilt) partitions."""
        return Readiness({"registry_caught_up": self.registry_caught_up, "owns_partitions": bool(self.states)})

    # -- registries --------------------------------------------------------------------
    def on_registry(self, topic: str, event: Envelope) -> None:
        if isinstance(event, WorkerHeartbeat):
            if event.plane in (None, self.group):
                self.registry.observe(event)
        elif isinstance(event, TenantRegistered):
            self.tenants[event.tenant_id] = event.limits
        elif topic == MODELS:
            self.models.observe(event)  # versions, their qualifications, aliases (schemas/model_book.py)

    # -- partition ownership -------------------------------------------------------------
    async def own_partitions(self, partitions: list[int]) -> None:
        async with self.lock:
            self.commands_read.forget([TopicPartition(COMMANDS, p) for p in partitions])
            for p in partitions:
                producer = make_producer(self.kafka, transactional_id=f"{self.group}-p{p}",
                                         client_id=f"controller-p{p}")
                await producer.start()  # InitProducerId: fences a previous owner, aborts its open transaction
                self.producers[p] = producer
            states = await self._rebuild(partitions)
            self.states.update(states)
            log.info("controller owns partitions=%s generations=%d", partitions,
                     sum(len(s.owners) for s in states.values()))
            self.ready.set()

    async def release_partitions(self, partitions: list[int]) -> None:
        async with self.lock:
            for p in partitions:
                self.states.pop(p, None)
                producer = self.producers.pop(p, None)
                if producer is not None:
                    await producer.stop()

    async def _rebuild(self, partitions: list[int]) -> dict[int, PartitionState]:
        states = {p: PartitionState(p) for p in partitions}
        if not partitions:
            return states
        consumer = make_consumer(self.kafka, client_id="controller-rebuild", auto_offset_reset="latest")
        await consumer.start()
        try:
            tps = [TopicPartition(CONTROL_CHANGELOG, p) for p in partitions]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            async for tp, records in read_to_end(consumer, tps):
                for record in records:
                    if record.value is None:  # a tombstone: that identity expired
                        states[tp.partition].apply_tombstone(record.key.decode("utf-8", "replace"), self.group)
                        continue
                    try:
                        item = decode(CONTROL_CHANGELOG, record.value)
                    except DecodeError as exc:
                        log.warning("changelog record skipped partition=%d offset=%d error=%s",
                                    record.partition, record.offset, type(exc).__name__)
                        continue
                    if item.plane == self.group:  # another control plane's state is not ours to adopt
                        states[tp.partition].apply_changelog(item)
        finally:
            await consumer.stop()
        for state in states.values():
            state.order_held()
        return states

    # -- processing ------------------------------------------------------------------------
    def decide(self, state: PartitionState, event: Envelope, now: datetime) -> Effects:
        if getattr(event, "plane", None) not in (None, self.group):
            return Effects()  # another control plane's command: consumed, not ours to decide
        if isinstance(event, SubmitGeneration):
            effects = self.decider.submit(state, event, now)
            self.metrics.observe_submit([reply.http_status for reply in effects.replies])
            return effects
        if isinstance(event, CancelGeneration):
            return self.decider.cancel(state, event, now)
        if isinstance(event, ReleaseReservation):
            return self.decider.release(state, event, now)
        if isinstance(event, AttemptRefused):
            return self.decider.refused(state, event, now)
        return Effects()

    async def process(self, batches: dict[TopicPartition, list]) -> None:
        """Decide every partition's batch, then commit the partitions' transactions concurrently: each
        partition has its own transactional producer, so one tenant's commit never waits for another's."""
        async with self.lock:
            commits = []
            now = utc_now()
            for tp, records in batches.items():
                state = self.states.get(tp.partition)
                producer = self.producers.get(tp.partition)
                if not records or state is None or producer is None:
                    continue  # revoked while the batch was in flight: the next owner re-reads it
                effects = Effects()
                letters: list[DeadLetter] = []
                for record in records:
                    try:
                        event = decode(COMMANDS, record.value)
                    except DecodeError as exc:
                        letters.append(dead_letter_for(record, exc))
                        continue
                    effects.extend(self.decide(state, event, now))
                commits.append(self._commit(producer, tp, records, effects, letters))
            await asyncio.gather(*commits)

    async def _commit(self, producer: AIOKafkaProducer, tp: TopicPartition, records: list, effects: Effects,
                      letters: list[DeadLetter]) -> None:
        started = time.perf_counter()
        async with producer.transaction():
            await self.write(producer, tp.partition, effects, letters)
            await producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, self.group)
        txn_ms = (time.perf_counter() - started) * 1000
        self.decisions += len(effects.replies)
        self.stats["batches"] += 1
        self.stats["records"] += len(records)
        self.stats["txn_ms_total"] += txn_ms
        self.stats["txn_ms_max"] = max(self.stats["txn_ms_max"], txn_ms)

    def log_stats(self) -> None:
        stats = self.stats
        if stats["batches"]:
            log.info("controller batches=%d records=%d decisions=%d txn_ms_mean=%.1f txn_ms_max=%.1f",
                     stats["batches"], stats["records"], self.decisions, stats["txn_ms_total"] / stats["batches"],
                     stats["txn_ms_max"])
        self.stats = {"batches": 0, "records": 0, "txn_ms_total": 0.0, "txn_ms_max": 0.0}
        self.decisions = 0

    async def write(self, producer: AIOKafkaProducer, partition: int, effects: Effects,
                    letters: list[DeadLetter] = ()) -> None:
        futures = []

        def send(topic: str, event: Envelope, to_partition: int | None = None):
            return producer.send(topic, value=encode(event), key=record_key(topic, event),
                                 headers=record_headers(event), partition=to_partition)

        for event in effects.generations:
            futures.append(await send(GENERATIONS, event))
        for event in effects.dispatch:
            futures.append(await send(DISPATCH, event))
        for record in effects.changelog:
            futures.append(await send(CONTROL_CHANGELOG, record, partition))
        for key in effects.tombstones:
            futures.append(await producer.send(CONTROL_CHANGELOG, value=None, key=key.encode("utf-8"),
                                               partition=partition))
        for reply in effects.replies:
            futures.append(await send(REPLIES, reply))
        for letter in letters:
            futures.append(await send(DLQ, letter))
        if futures:
            await asyncio.gather(*futures)

    async def check_leases(self) -> None:
        async with self.lock:
            now = utc_now()
            for p, state in list(self.states.items()):
                read_through = self.commands_read.of(TopicPartition(COMMANDS, p))
                effects = self.decider.expire_leases(state, now, float("-inf") if read_through is None else read_through)
                effects.extend(self.decider.expire_identities(state, now))
                interrupted = len(effects.generations)
                effects.extend(self.decider.dispatch_held(state, now))
                if not effects:
                    continue
                producer = self.producers[p]
                async with producer.transaction():
                    await self.write(producer, p, effects)
                self.metrics.interrupted.inc(interrupted)
                if len(effects.dispatch) > interrupted:
                    log.info("held work dispatched partition=%d attempts=%d still_held=%d", p,
                             len(effects.dispatch) - interrupted, len(state.held))
                if effects.tombstones:
                    log.info("identities expired partition=%d count=%d", p, len(effects.tombstones))
                for event in effects.generations[:interrupted]:
                    log.warning("attempt interrupted generation=%s epoch=%s worker=%s reason=%s", event.generation_id,
                                event.epoch, getattr(event, "worker_id", None), getattr(event, "reason", None))

    async def _check_co_partitioning(self, follower: Follower) -> None:
        """Changelog records go to the partition number of their command: both topics need equal counts."""
        from plumbing.kafka.clients import partitions_of

        commands = await partitions_of(follower.consumer, COMMANDS)
        changelog = await partitions_of(follower.consumer, CONTROL_CHANGELOG)
        if len(commands) != len(changelog):
            raise RuntimeError(f"{COMMANDS} has {len(commands)} partitions but {CONTROL_CHANGELOG} has "
                               f"{len(changelog)}: controller state would not be co-partitioned")

    # -- main loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        await self.http.start()  # first: a taken port fails the start before anything else runs
        follower = Follower(self.kafka, [WORKERS, TENANTS, MODELS], self.on_registry,
                            client_id="controller-registry")
        await follower.start()
        follow_task = asyncio.create_task(follower.run(), name="controller-registry")
        consumer = make_consumer(self.kafka, group_id=self.group, client_id="controller",
                                 auto_offset_reset=self.settings.controller_start, session_timeout_ms=6000,
                                 heartbeat_interval_ms=1000)
        try:
            # Leases are judged against the registry, so it must be current before any check.
            await asyncio.wait_for(follower.caught_up.wait(), timeout=60)
            self.registry_caught_up = True
            await self._check_co_partitioning(follower)
            consumer.subscribe([COMMANDS], listener=_Rebalance(self))
            await consumer.start()
            interval = self.settings.lease_check_interval_ms / 1000
            next_check = time.monotonic() + interval
            next_stats = time.monotonic() + 10
            while True:
                if follow_task.done():
                    follow_task.result()  # surface the follower's failure
                timeout_ms = max(1, int((next_check - time.monotonic()) * 1000))
                batches = await consumer.getmany(timeout_ms=timeout_ms, max_records=500)
                self.registry.read_through = follower.read_through()
                if batches:
                    await self.process(batches)
                await self.commands_read.note(consumer)
                if time.monotonic() >= next_check:
                    await self.check_leases()
                    next_check = time.monotonic() + interval
                if time.monotonic() >= next_stats:
                    self.log_stats()
                    next_stats = time.monotonic() + 10
        finally:
            follow_task.cancel()
            await self.http.stop()
            await consumer.stop()
            await follower.stop()
            for producer in self.producers.values():
                await producer.stop()
            self.producers.clear()
