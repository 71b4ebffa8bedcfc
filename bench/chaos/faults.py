"""The faults of the chaos run, each a coroutine that injects one fault and returns when it is over.

    worker     kill -9 a worker, start a new one (new id); its attempts end `interrupted` after the lease
    gateway    kill -9 one gateway (of several), start it again after `role_down_s`; clients move to another
    controller kill -9 one controller (of several); its llm.commands partitions move to the other one after
               the group's session timeout, and come back when it is started again after `role_down_s`
    broker     kill -9 the broker leading llm.generations partition 0, leave it down, start it again
    postgres   stop (fast) and start PostgreSQL on the same port
    projector  kill -9 a projector and start it again (it resumes from the offsets it stored)
    rebuild    drop the projections' database, create it, migrate, and project everything again from offset 0
               (every projector stopped meanwhile); the exporter's ledger and offsets are kept, as an operator
               rebuilding must: they record a billing system's answers, which no replay gives back
    exporter   kill -9 the exporter while the sink holds the answer to its batch, start it again
               (bench/chaos/export.py)
    usage      re-publish already counted usage reports (same event, and same report under a new event id)
               and late reports after the seal, for generations that already ended
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from bench.chaos.checks import LogRecord, generation_events
from bench.chaos.roles import Role
from infra.services import LocalServices
from infra.state import ServicesState
from migrations import runner
from plumbing.kafka.clients import Kafka, make_admin, make_producer, publish
from schemas.lifecycle import TERMINAL_TYPES, UsageReported
from schemas.topics import GENERATIONS

PROBE_TOPIC = "chaos.probe"
log = logging.getLogger("ledgerlm.chaos")


@dataclass
class FaultLog:
    faults: list[dict] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)

    def add(self, kind: str, began: float, **details: object) -> None:
        """A fault that ran from `began` (monotonic) until now: `began_s` and `at_s` (its end) on the run's clock."""
        self.faults.append({"fault": kind, "began_s": round(began - self.began, 1),
                            "at_s": round(time.monotonic() - self.began, 1), **details})
        log.info("fault done %s", self.faults[-1])


@dataclass
class Plane:
    """Everything a fault acts on."""

    services: LocalServices
    bootstrap: str
    database_url: str
    roles: dict[str, Role]
    new_worker: Callable[[], Role]  # a worker role with a fresh worker id, not started


async def kill_worker(plane: Plane, journal: FaultLog, name: str = "worker") -> None:
    """kill -9 a worker with its attempts in flight and start another: until the new one has loaded its model
    and heartbeated, admissions go to the other workers, or are 503 (clients retry) when there is none."""
    old, replacement = plane.roles[name], plane.new_worker()
    began = time.monotonic()
    old.kill9()
    replacement.crash_restarts = old.crash_restarts
    plane.roles[name] = replacement.start()
    journal.add("worker_kill9", began, killed=old.args[-1], replacement=replacement.args[-1])


async def kill_broker(plane: Plane, journal: FaultLog, down_s: float) -> None:
    index = await leader_of(plane.bootstrap, GENERATIONS, 0)
    killed_at = time.monotonic()
    killed = await asyncio.to_thread(plane.services.kill_broker, index)
    await asyncio.sleep(down_s)
    began = time.monotonic()
    await asyncio.to_thread(plane.services.start_broker, index)
    journal.add("broker_kill9", killed_at, broker=index, killed=killed, down_s=down_s,
               restart_s=round(time.monotonic() - began, 1))


async def leader_of(kafka: Kafka, topic: str, partition: int) -> int:
    admin = make_admin(kafka, client_id="chaos-leader")
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return next(p["leader"] for p in described[0]["partitions"] if p["partition"] == partition)


async def restart_postgres(plane: Plane, journal: FaultLog) -> None:
    settings = plane.services.settings
    began = time.monotonic()

    def restart() -> None:
        state = ServicesState.load(settings.state_file)
        plane.services.postgres.stop(state.postgres)
        state.postgres = plane.services.postgres.start(state.postgres, state.postgres.port,
                                                       settings.startup_timeout_s)
        state.save(settings.state_file)

    await asyncio.to_thread(restart)
    journal.add("postgres_restart", began, seconds=round(time.monotonic() - began, 1))


async def kill_role(plane: Plane, journal: FaultLog, name: str, down_s: float) -> None:
    """kill -9 the role process `name`, leave it down `down_s` (its replicas, if any, serve), start it again."""
    role, began = plane.roles[name], time.monotonic()
    role.kill9()
    await asyncio.sleep(down_s)
    role.start()
    journal.add(f"{role.name}_kill9", began, killed=name, down_s=down_s)


async def rebuild_projections(plane: Plane, journal: FaultLog) -> None:
    """Drop the database under running gateways; the projectors rebuild everything from offset 0."""
    stopped = [role for role in plane.roles.values() if role.name in ("projector", "exporter")]
    for role in stopped:
        role.stop()
    began = time.monotonic()
    kept = await asyncio.to_thread(recreate_database, plane.database_url)
    for role in stopped:
        role.start()
    journal.add("projections_dropped_and_rebuilt", began, recreate_s=round(time.monotonic() - began, 1),
                export_rows_kept=kept)


# Not projections: what billing systems answered (migration 0007), copied across the rebuild.
KEPT_TABLES = ("export_ledger", "export_offsets")


def recreate_database(database_url: str) -> int:
    """Drop and create the database, migrate it, and put back the export tables; how many rows were kept."""
    kept: dict[str, bytes] = {}
    with psycopg.connect(database_url) as conn:
        for table in KEPT_TABLES:
            with conn.cursor().copy(f"COPY {table} TO STDOUT") as copy:
                kept[table] = b"".join(bytes(chunk) for chunk in copy)
    base, name = database_url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    runner.upgrade(database_url)
    with psycopg.connect(database_url) as conn:
        for table, rows in kept.items():
            with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
                copy.write(rows)
    return sum(rows.count(b"\n") for rows in kept.values())


async def inject_usage(plane: Plane, journal: FaultLog, generation_ids: set[str], limit: int = 5) -> int:
    """Duplicate and late usage reports for up to `limit` ended generations of the run; returns how many."""
    began = time.monotonic()
    events = await generation_events(plane.bootstrap)
    ended = {e.generation_id for e in events if e.type in TERMINAL_TYPES} & generation_ids
    reports = [e for e in events if e.type == "UsageReported" and e.generation_id in ended]
    last: dict[str, UsageReported] = {}
    for report in reports:
        if report.generation_id not in last or report.report_seq > last[report.generation_id].report_seq:
            last[report.generation_id] = report
    chosen = sorted(last.values(), key=lambda r: r.generation_id)[:limit]
    producer = make_producer(plane.bootstrap, client_id="chaos-usage")
    await producer.start()
    injected = 0
    try:
        for report in chosen:
            late = report.usage.model_copy(update={"generated_output_tokens": report.usage.generated_output_tokens + 7})
            for event in (report,  # the same record again
                          report.model_copy(update={"event_id": uuid.uuid4()}),  # same report, new event id
                          report.model_copy(update={"event_id": uuid.uuid4(), "report_seq": report.report_seq + 1,
                                                    "usage": late})):  # a late report, after the seal
                await publish(producer, GENERATIONS, event)
                injected += 1
    finally:
        await producer.stop()
    journal.add("usage_duplicates_and_late", began, generations=len(chosen), reports=injected,
                generation_ids=[r.generation_id for r in chosen])
    return injected


class Probe:
    """Writes keyed records (acks=all) to a replicated probe topic and remembers each acknowledged offset."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.acked: list[LogRecord] = []
        self.failed = 0

    async def run(self, stop: asyncio.Event, every_s: float = 0.05) -> None:
        producer = make_producer(self.bootstrap, client_id="chaos-probe")
        await producer.start()
        try:
            n = 0
            while not stop.is_set():
                key = f"probe-{n}".encode()
                try:
                    meta = await asyncio.wait_for(producer.send_and_wait(PROBE_TOPIC, key=key, value=key), 30)
                    self.acked.append(LogRecord(meta.partition, meta.offset, key, key))
                except Exception:  # not acknowledged: not a promise, so not a loss
                    self.failed += 1
                n += 1
                await asyncio.sleep(every_s)
        finally:
            await producer.stop()
