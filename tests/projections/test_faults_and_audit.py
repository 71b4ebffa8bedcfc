"""Exactly-once effect under crashes, rebalances and aborted transactions; the replay audit."""
import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from plumbing.kafka.clients import make_producer, publish
from plumbing.settings import Settings
from projections.audit import audit_replay
from projections.lifecycle import LifecycleProjection
from projections.offsets import StaleOffset, load_offsets
from projections.runtime import Batch, Projector
from schemas.topics import GENERATIONS
from tests.projections.conftest import Gen, one
from tests.waiting import wait_until

WATERMARK = ("SELECT generated_output_tokens, reports_counted FROM usage_watermarks "
             "WHERE generation_id = %s AND epoch = 1")


def run_projector(bootstrap: str, database_url: str, *args: str, crash_after: int | None = None):
    env = {**os.environ, "LEDGERLM_KAFKA_BOOTSTRAP": bootstrap, "LEDGERLM_DATABASE_URL": database_url}
    env.pop("LEDGERLM_PROJECTOR_CRASH_AFTER_BATCHES", None)
    if crash_after is not None:
        env["LEDGERLM_PROJECTOR_CRASH_AFTER_BATCHES"] = str(crash_after)
    return subprocess.run([sys.executable, "-m", "ledgerlm", *args], capture_output=True, text=True,
                          env=env, timeout=180)


async def workload(emit) -> list[Gen]:
    """Completions, a cancel-like early end and an interrupted attempt, with a duplicate report."""
    gens = [Gen(tenant_id="audit-tenant", generation_id=f"gen-{uuid.uuid4().hex[:12]}") for _ in range(3)]
    done, cut, lost = gens
    dup = done.report(1, 10)
    await emit(done.admitted(), done.started(), dup, dup, done.report(2, 25), done.tokens(1, 25, n=25),
               done.completed(25), done.finished(2, output=25))
    await emit(cut.admitted(), cut.started(), cut.report(1, 3), cut.completed(4), cut.report(7, 9))
    await emit(lost.admitted(), lost.started(), lost.report(1, 6), *[lost.tokens(s, s) for s in range(1, 10)],
               lost.interrupted(), lost.finished(10, reason="interrupted", output=6))
    return gens


async def test_killed_between_rows_and_commit_then_restarted_applies_once(emit, bootstrap, scratch_database_url):
    done, _, lost = await workload(emit)
    crashed = run_projector(bootstrap, scratch_database_url, "project", "--once", "--only", "generations",
                            crash_after=1)
    assert crashed.returncode == 86, crashed.stderr[-2000:]
    with psycopg.connect(scratch_database_url) as conn:
        assert one(conn, "SELECT count(*) FROM projection_offsets WHERE projection = 'generations'") == (0,)
        assert one(conn, "SELECT count(*) FROM generations") == (0,)
    resumed = run_projector(bootstrap, scratch_database_url, "project", "--once", "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    again = run_projector(bootstrap, scratch_database_url, "project", "--once", "--json")
    assert again.returncode == 0, again.stderr[-2000:]  # re-running applies nothing twice (checked below)
    with psycopg.connect(scratch_database_url) as conn:
        assert one(conn, WATERMARK, done.generation_id) == (25, 2)
        assert one(conn, "SELECT count(*) FROM billing_ledger WHERE generation_id = ANY(%s)",
                   [done.generation_id, lost.generation_id]) == (2,)
        assert one(conn, "SELECT billed_output_tokens, usage_label FROM billing_ledger WHERE generation_id = %s",
                   lost.generation_id) == (6, "interrupted")
    audit = run_projector(bootstrap, scratch_database_url, "audit", "replay", "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr[-2000:]
    assert json.loads(audit.stdout)["differences"] == 0


async def test_a_stale_projector_is_refused_by_compare_and_set(emit, bootstrap, projection_db):
    gen = Gen(tenant_id="cas-tenant", generation_id=f"gen-{uuid.uuid4().hex[:12]}")
    await emit(gen.admitted(), gen.started(), gen.report(1, 11))
    stale = Projector(bootstrap, projection_db, [LifecycleProjection()])
    current = Projector(bootstrap, projection_db, [LifecycleProjection()])
    try:
        partitions = [TopicPartition(GENERATIONS, p) for p in range(6)]
        stale._load_stored(partitions)  # believes nothing was applied yet
        await current.catch_up()  # the new owner applies everything
        tp = next(tp for tp in partitions if current.stored.get(tp) != stale.stored.get(tp))
        with pytest.raises(StaleOffset):
            stale._commit_batches([Batch(LifecycleProjection(), tp, stale.stored.get(tp), current.stored[tp] + 1,
                                          [gen.report(2, 99)])])
    finally:
        stale.close()
        current.close()
    with psycopg.connect(projection_db) as conn:
        assert one(conn, WATERMARK, gen.generation_id) == (11, 1)


async def test_events_of_an_aborted_transaction_never_appear(bootstrap, projection_db, project, emit):
    aborted = Gen(tenant_id="txn-tenant", generation_id=f"gen-{uuid.uuid4().hex[:12]}")
    committed = Gen(tenant_id="txn-tenant", generation_id=f"gen-{uuid.uuid4().hex[:12]}")
    producer = make_producer(bootstrap, transactional_id=f"test-abort-{uuid.uuid4().hex[:8]}")
    await producer.start()
    try:
        await producer.begin_transaction()
        await publish(producer, GENERATIONS, aborted.admitted())
        await publish(producer, GENERATIONS, aborted.report(1, 50))
        await producer.abort_transaction()
        async with producer.transaction():
            await publish(producer, GENERATIONS, committed.admitted())
    finally:
        await producer.stop()
    await project(LifecycleProjection())
    with psycopg.connect(projection_db) as conn:
        assert one(conn, "SELECT count(*) FROM generations WHERE generation_id = %s", aborted.generation_id) == (0,)
        assert one(conn, "SELECT count(*) FROM usage_reports WHERE generation_id = %s", aborted.generation_id) == (0,)
        assert one(conn, "SELECT status FROM generations WHERE generation_id = %s",
                   committed.generation_id) == ("admitted",)


async def test_audit_finds_a_tampered_row_and_exits_1(emit, bootstrap, scratch_database_url):
    done, _, _ = await workload(emit)
    assert run_projector(bootstrap, scratch_database_url, "project", "--once").returncode == 0
    with psycopg.connect(scratch_database_url) as conn:  # another consumer's positions in the same table
        for partition in range(6):
            conn.execute("INSERT INTO projection_offsets VALUES ('someone-else', %s, %s, 1)", (GENERATIONS, partition))
    report = await audit_replay(bootstrap, scratch_database_url, Settings())
    assert report.differences == 0 and report.replayed["generations"] > 0, json.dumps(report.as_dict())[:3000]
    with psycopg.connect(scratch_database_url) as conn:
        conn.execute("UPDATE usage_watermarks SET generated_output_tokens = 24 WHERE generation_id = %s",
                     (done.generation_id,))
    audit = run_projector(bootstrap, scratch_database_url, "audit", "replay")
    assert audit.returncode == 1
    assert "usage_watermarks: 1 row(s) only live, 1 only in replay" in audit.stdout
    assert done.generation_id in audit.stdout
    with psycopg.connect(scratch_database_url) as conn:
        leftovers = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'audit_%' "
                                 "AND nspname <> 'audit_checkpoint'").fetchall()
    assert leftovers == []


async def start_at_log_end(bootstrap: str, database_url: str, projection) -> None:
    """Store the current end offsets, so a scratch projector skips everything already in the log."""
    from plumbing.kafka.clients import make_consumer, partitions_of
    from projections.offsets import advance

    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        partitions = await partitions_of(consumer, projection.topic)
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    with psycopg.connect(database_url) as conn:
        for tp, end in ends.items():
            advance(conn, projection.name, tp.topic, tp.partition, None, end)


async def test_two_projectors_through_a_rebalance_apply_everything_once(emit, bootstrap, scratch_database_url):
    import asyncio

    await start_at_log_end(bootstrap, scratch_database_url, LifecycleProjection())
    group = f"test-rebalance-{uuid.uuid4().hex[:8]}"
    first = Projector(bootstrap, scratch_database_url, [LifecycleProjection()], group_id=group)
    second = Projector(bootstrap, scratch_database_url, [LifecycleProjection()], group_id=group)
    stops = [asyncio.Event(), asyncio.Event()]
    tenant = f"rebalance-{uuid.uuid4().hex[:8]}"  # other tests may write to the same topics meanwhile
    gens = [Gen(tenant_id=tenant, generation_id=f"gen-{uuid.uuid4().hex[:12]}") for _ in range(24)]

    async def wait_for(sql: str, expected: int) -> None:
        def count() -> int:
            with psycopg.connect(scratch_database_url) as conn:
                return one(conn, sql, tenant)[0]

        def state(got: int) -> str:
            with psycopg.connect(scratch_database_url) as conn:
                offsets = conn.execute("SELECT partition, next_offset FROM projection_offsets ORDER BY 1").fetchall()
            return (f"{expected} (got {got}): {sql}; offsets {offsets}; "
                    f"first {first.stats} {sorted(tp.partition for tp in first.assignment)}; "
                    f"second {second.stats} {sorted(tp.partition for tp in second.assignment)}")

        await wait_until(count, 20, step_s=0.1, accept=lambda got: got == expected, what=state)

    tasks = [asyncio.create_task(first.run(stops[0], lag_every_s=3600))]
    try:
        for g in gens[:12]:
            await emit(g.admitted(), g.started(), g.report(1, 5))
        await wait_for("SELECT count(*) FROM usage_watermarks WHERE tenant_id = %s", 12)
        tasks.append(asyncio.create_task(second.run(stops[1], lag_every_s=3600)))
        # the group rebalances: both members own partitions, none owned twice
        await wait_until(lambda: second.assignment and first.assignment and
                         len(first.assignment | second.assignment) == 6, 15, step_s=0.05,
                         what="both members to own partitions")
        assert not first.assignment & second.assignment
        assert len(first.assignment) + len(second.assignment) == 6
        for g in gens:  # during the rebalance: reports for every generation, then admissions of the rest
            await emit(g.report(2, 9))
        for g in gens[12:]:
            await emit(g.admitted(), g.started(), g.report(1, 5), g.completed(9))
        for g in gens[:12]:
            await emit(g.completed(9))
        await wait_for("SELECT count(*) FROM billing_ledger WHERE tenant_id = %s", 24)
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks)
        first.close()
        second.close()
    with psycopg.connect(scratch_database_url) as conn:
        assert one(conn, "SELECT count(*), sum(reports_counted) FROM usage_watermarks WHERE tenant_id = %s",
                   tenant) == (24, 48)
        assert one(conn, "SELECT count(*), sum(billed_output_tokens) FROM billing_ledger WHERE tenant_id = %s",
                   tenant) == (24, 24 * 9)
        assert one(conn, "SELECT count(*) FROM usage_reports r JOIN generations g USING (generation_id) "
                         "WHERE g.tenant_id = %s", tenant) == (48,)
    assert second.stats.applied.get("generations", 0) > 0


def test_lag_metric_is_written_in_prometheus_text_format(tmp_path):
    from projections.runtime import write_lag_metric

    path = tmp_path / "metrics" / "projector.prom"
    write_lag_metric(path, {"stream": 12, "generations": 0})
    assert path.read_text().splitlines()[2:] == ['ledgerlm_projection_lag_records{projection="generations"} 0',
                                                 'ledgerlm_projection_lag_records{projection="stream"} 12']


async def test_an_event_the_database_refuses_is_skipped_and_reported(emit, bootstrap, scratch_database_url):
    gen = Gen(tenant_id="refuse", generation_id=f"gen-{uuid.uuid4().hex[:12]}")
    await start_at_log_end(bootstrap, scratch_database_url, LifecycleProjection())
    bad = gen.admitted()
    huge = bad.model_copy(update={"input_tokens": 2**40})  # beyond the integer column: DataError
    await emit(huge, gen.report(1, 5))
    refused = []

    async def reject(tp, offset, event, reason, key=None):
        refused.append((event.type, reason.split(":")[0], reason.endswith("[SQLSTATE 22003]"), offset >= 0, key))

    projector = Projector(bootstrap, scratch_database_url, [LifecycleProjection()], reject=reject)
    try:
        stats = await projector.catch_up()
    finally:
        projector.close()
    assert refused == [("Admitted", "NumericValueOutOfRange", True, True, gen.generation_id.encode())]
    assert stats.refused == {"generations": 1}
    with psycopg.connect(scratch_database_url) as conn:
        assert one(conn, WATERMARK, gen.generation_id) == (5, 1)
        assert one(conn, "SELECT count(*) FROM generations WHERE generation_id = %s", gen.generation_id) == (0,)


async def test_a_refused_seal_is_kept_in_postgres_when_its_dead_letter_cannot_be_published(
        emit, bootstrap, scratch_database_url):
    gen = Gen(tenant_id="refuse-kept", generation_id=f"gen-{uuid.uuid4().hex[:12]}")
    await start_at_log_end(bootstrap, scratch_database_url, LifecycleProjection())
    seal = gen.completed(2**63)  # beyond bigint: the database refuses the terminal event
    await emit(gen.admitted(), gen.report(1, 5), seal)

    async def dead_letter_queue_unreachable(tp, offset, event, reason, key=None):  # fault injection: the publish fails
        raise KafkaConnectionError("simulated")

    projector = Projector(bootstrap, scratch_database_url, [LifecycleProjection()],
                          reject=dead_letter_queue_unreachable)
    try:
        stats = await projector.catch_up()
    finally:
        projector.close()
    assert stats.refused == {"generations": 1}
    with psycopg.connect(scratch_database_url) as conn:
        kept = conn.execute("SELECT event_type, split_part(reason, ':', 1), event::jsonb->>'generation_id', event_id, topic, "
                            "partition, \"offset\" FROM refused_events WHERE projection = 'generations'").fetchall()
        assert [row[:5] for row in kept] == [("Completed", "NumericValueOutOfRange", gen.generation_id,
                                              seal.event_id, GENERATIONS)]
        partition, offset = kept[0][5:]
        assert load_offsets(conn, "generations", GENERATIONS)[partition] > offset  # skipped in the same commit
        assert one(conn, "SELECT status FROM generations WHERE generation_id = %s", gen.generation_id) == ("admitted",)
