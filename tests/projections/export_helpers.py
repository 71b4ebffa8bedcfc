"""Helpers of the export tests: sealed generations on the real log, an exporter run until it has caught up."""
from __future__ import annotations

import asyncio
import uuid
from contextlib import asynccontextmanager

import psycopg

from plumbing.kafka.clients import make_consumer, partitions_of, publish
from projections.export import ledger
from projections.export.runtime import Exporter
from projections.export.sinks.factory import SINKS
from projections.lifecycle import LifecycleProjection
from projections.offsets import EXPORTS, advance
from projections.tenants import TenantsProjection
from schemas.registry_events import TenantRegistered
from schemas.topics import GENERATIONS, TENANTS
from schemas.values import BillingIds, TenantLimits
from tests.projections.conftest import Gen
from tests.waiting import wait_until


async def log_ends(bootstrap: str, topic: str = GENERATIONS, committed: bool = True) -> dict[int, int]:
    """Each partition's end: as a read-committed reader sees it (before any transaction still open), or, with
    `committed=False`, after every record written so far."""
    consumer = make_consumer(bootstrap, isolation_level="read_committed" if committed else "read_uncommitted")
    await consumer.start()
    try:
        ends = await consumer.end_offsets(await partitions_of(consumer, topic))
    finally:
        await consumer.stop()
    return {tp.partition: end for tp, end in ends.items()}


async def start_sinks_at_end(bootstrap: str, database_url: str) -> None:
    """Every sink's exporter starts at the current end of llm.generations (other tests' seals stay out).

    The end after every record written, not the committed end: a transaction still open then (a role of an
    earlier test finishing its work) would otherwise put all that follows it on its partition in the test's
    range, once it commits (a CI run's exporter stood 591 records behind on one partition after 240 s)."""
    ends = await log_ends(bootstrap, committed=False)
    with psycopg.connect(database_url) as conn:
        for sink in SINKS:
            for partition, end in ends.items():
                advance(conn, sink, GENERATIONS, partition, None, end, EXPORTS)


async def seal_generations(producer, project, count: int, billing: BillingIds = BillingIds(),
                           tenant_id: str | None = None) -> tuple[str, list[str]]:
    """A tenant and `count` generations sealed in the projection (every third interrupted): their ids."""
    tenant = tenant_id or f"tenant-{uuid.uuid4().hex[:8]}"
    await publish(producer, TENANTS, TenantRegistered(tenant_id=tenant, name=tenant, limits=TenantLimits(),
                                                       api_key_hash=uuid.uuid4().hex * 2, api_key_prefix="llm_x",
                                                       billing=billing))
    ids = []
    for i in range(count):
        gen = Gen(tenant_id=tenant, generation_id=f"gen-{uuid.uuid4().hex[:12]}")
        end = gen.interrupted() if i % 3 == 2 else gen.completed(output=10 + i)
        for event in (gen.admitted(), gen.started(), gen.report(1, output=5 + i), end):
            await publish(producer, GENERATIONS, event)
        ids.append(gen.generation_id)
    await project(LifecycleProjection(), TenantsProjection())
    return tenant, ids


def sealed(conn: psycopg.Connection, generation_ids: list[str]) -> dict[str, tuple]:
    rows = conn.execute("SELECT generation_id, tenant_id, epoch, model_version, usage_label, end_reason, "
                        "billed_input_tokens, billed_cached_input_tokens, billed_output_tokens, sealed_at "
                        "FROM billing_ledger WHERE generation_id = ANY(%s)", (generation_ids,)).fetchall()
    return {row[0]: row[1:] for row in rows}


def ledger_rows(conn: psycopg.Connection, sink: str) -> dict[str, tuple[str, str | None]]:
    rows = conn.execute("SELECT generation_id, outcome, reason FROM export_ledger WHERE sink = %s",
                        (sink,)).fetchall()
    return {gid: (outcome, reason) for gid, outcome, reason in rows}


async def caught_up(conn: psycopg.Connection, sink: str, ends: dict[int, int]) -> bool:
    stored = {p: o for p, o in conn.execute("SELECT partition, next_offset FROM export_offsets WHERE sink = %s",
                                            (sink,)).fetchall()}
    return all(stored.get(p, 0) >= end for p, end in ends.items())


def rewind(conn: psycopg.Connection, sink: str, positions: dict[int, int]) -> None:
    """The sink's exporter stands at `positions` again: what it exported since is read once more."""
    conn.execute("DELETE FROM export_offsets WHERE sink = %s", (sink,))
    for partition, offset in positions.items():
        advance(conn, sink, GENERATIONS, partition, None, offset, EXPORTS)


@asynccontextmanager
async def running(exporter: Exporter):
    """The exporter as a group member in this loop, stopped (and awaited) on leaving."""
    stop = asyncio.Event()
    task = asyncio.create_task(exporter.run(stop, lag_every_s=0.5))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def export_until_caught_up(exporter: Exporter, conn: psycopg.Connection, timeout_s: float = 240) -> None:
    # the exporter holds back what the lifecycle projection has not committed, and the log may grow meanwhile
    # (another test's roles finishing their work): caught up means through what is projected now. A stress run
    # (the suite beside 2 CPU hogs) once took more than 120 s here; the exporter shares this test's event loop,
    # so the check asks Postgres every 100 ms, not every 20, and a timeout says where the exporter stood.
    ends = ledger.projected_through(conn)
    sink = exporter.sink.name
    async with running(exporter) as task:
        await wait_until(lambda: task.done() or caught_up(conn, sink, ends), timeout_s,
                         lambda _: f"the {sink} exporter at the end of the log: at {ledger.positions(conn, sink)}, "
                                   f"the projected end {ends}, {exporter.stats}, assigned "
                                   f"{sorted(tp.partition for tp in exporter.assignment)}", step_s=0.1)
        assert not task.done(), f"the exporter stopped: {task.exception()!r}"
