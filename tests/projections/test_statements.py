"""Closed billing periods and statements, projected from `llm.generations` (projections/statements.py).

Synthetic generations sealed in old periods (so no other test's seal falls in them), markers written with
the close command's own writer, the projector run against the real broker and a scratch database.
"""
from __future__ import annotations

import uuid

import psycopg
import pytest

from migrations import runner
from plumbing.kafka.clients import make_consumer, partitions_of, publish
from plumbing.kafka.follower import partition_for
from plumbing.settings import Settings
from producers.billing_close import write_markers
from projections.audit import audit_replay
from projections.lifecycle import LifecycleProjection
from projections.periods import Period
from projections.registry import all_projections
from projections.runtime import Projector, connect
from projections.statement_lines import LineItem, line_items_sha256
from schemas.billing_periods import PeriodClosed
from schemas.topics import GENERATIONS
from tests.factories import old_period
from tests.projections.conftest import Gen, all_rows, one

STATEMENT = ("SELECT generations, late_generations, line_items_sha256 FROM statements "
             "WHERE tenant_id = %s AND period = %s")
ITEMS = ("SELECT b.generation_id, b.epoch, b.model_version, b.usage_label, b.end_reason, b.sealed_at, i.belongs_to, "
         "b.billed_input_tokens, b.billed_cached_input_tokens, b.billed_output_tokens FROM statement_items i "
         "JOIN billing_ledger b USING (generation_id) WHERE i.tenant_id = %s AND i.period = %s")


def in_period(tenant: str, period: Period, day: int = 20, generation_id: str | None = None) -> Gen:
    return Gen(tenant, generation_id or f"gen-{uuid.uuid4().hex[:12]}", clock=period.start.replace(day=day))


def sealed(gen: Gen, output: int = 7, model: str = "demo@1") -> list:
    admitted = gen.admitted().model_copy(update={"model_version": model})
    return [admitted, gen.started(), gen.report(1, output), gen.completed(output)]


def statement_sha(conn, tenant: str, period: str) -> str:
    return line_items_sha256(LineItem(*row) for row in all_rows(conn, ITEMS, tenant, period))


async def generation_partitions(bootstrap: str) -> int:
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        return len(await partitions_of(consumer, GENERATIONS))
    finally:
        await consumer.stop()


def gen_in_partition(tenant: str, period: Period, partition: int, partitions: int) -> Gen:
    while True:
        gen = in_period(tenant, period)
        if partition_for(gen.generation_id, partitions) == partition:
            return gen


async def test_closing_a_period_makes_each_tenants_statement_with_totals_per_model_and_meter(
        gen, emit, project, conn, bootstrap):
    period, other = old_period(), f"tenant-{uuid.uuid4().hex[:8]}"
    a, b, c = (in_period(gen.tenant_id, period) for _ in range(3))
    interrupted = in_period(gen.tenant_id, period)
    await emit(*sealed(a, 7), *sealed(b, 3), *sealed(c, 5, model="big@2"), *sealed(in_period(other, period), 2))
    await emit(interrupted.admitted(), interrupted.started(), interrupted.report(1, 4), interrupted.interrupted())
    await project()
    assert one(conn, "SELECT count(*) FROM billing_periods WHERE period = %s", str(period)) == (0,)
    await write_markers(bootstrap, period)
    await project()
    assert one(conn, STATEMENT, gen.tenant_id, str(period)) == (4, 0, statement_sha(conn, gen.tenant_id, str(period)))
    assert all_rows(conn, "SELECT model_version, meter, generations, quantity FROM statement_totals "
                          "WHERE tenant_id = %s AND period = %s ORDER BY 1, 2", gen.tenant_id, str(period)) == [
        ("big@2", "cached_input_tokens", 1, 16), ("big@2", "input_tokens", 1, 40), ("big@2", "output_tokens", 1, 5),
        ("demo@1", "cached_input_tokens", 3, 48), ("demo@1", "input_tokens", 3, 120),
        ("demo@1", "output_tokens", 3, 14)]
    assert one(conn, STATEMENT, other, str(period))[:2] == (1, 0)
    assert one(conn, "SELECT tenants, generations, partitions FROM billing_periods WHERE period = %s",
               str(period)) == (2, 5, await generation_partitions(bootstrap))


async def test_a_generation_sealed_after_its_period_closed_is_billed_in_the_next_and_names_its_own(
        gen, emit, project, conn, bootstrap):
    period = old_period()
    on_time, late = in_period(gen.tenant_id, period, day=28), in_period(gen.tenant_id, period, day=28)
    await emit(*sealed(on_time, 6), *sealed(late, 9)[:3])
    await write_markers(bootstrap, period)
    await emit(late.completed(9))  # sealed on the 28th by its own clock, after the close in the log
    await project()  # one batch: the marker cuts it
    closed = one(conn, STATEMENT, gen.tenant_id, str(period))
    assert closed == (1, 0, statement_sha(conn, gen.tenant_id, str(period)))
    assert all_rows(conn, "SELECT generation_id, period, belongs_to FROM statement_items WHERE tenant_id = %s "
                          "ORDER BY period", gen.tenant_id) == [
        (on_time.generation_id, str(period), str(period)), (late.generation_id, str(period.next()), str(period))]
    await write_markers(bootstrap, period.next())
    await project()
    sha = statement_sha(conn, gen.tenant_id, str(period.next()))
    assert one(conn, STATEMENT, gen.tenant_id, str(period.next())) == (1, 1, sha)
    assert one(conn, STATEMENT, gen.tenant_id, str(period)) == closed  # the closed statement did not move


async def test_a_period_closes_when_every_partition_has_its_marker_and_each_partition_decides_its_own_seals(
        gen, emit, project, conn, bootstrap, producer):
    period, partitions = old_period(), await generation_partitions(bootstrap)
    close_id = uuid.uuid4()

    async def mark(partition: int, close: uuid.UUID = close_id) -> None:
        await publish(producer, GENERATIONS, PeriodClosed(period=str(period), partition=partition,
                                                          partitions=partitions, close_id=close),
                      partition=partition)

    unmarked = gen_in_partition(gen.tenant_id, period, 0, partitions)
    marked = gen_in_partition(gen.tenant_id, period, 1, partitions)
    for partition in range(1, partitions):
        await mark(partition)
    await emit(*sealed(unmarked, 4), *sealed(marked, 8))  # both after the markers written so far
    await project()
    assert one(conn, "SELECT count(*) FROM billing_periods WHERE period = %s", str(period)) == (0,)
    await mark(0)
    await mark(0, uuid.uuid4())  # a second close: its markers change nothing
    await project()
    assert one(conn, STATEMENT, gen.tenant_id, str(period))[:2] == (1, 0)
    assert all_rows(conn, "SELECT generation_id, period FROM statement_items WHERE tenant_id = %s ORDER BY period",
                    gen.tenant_id) == [(unmarked.generation_id, str(period)),
                                       (marked.generation_id, str(period.next()))]
    assert one(conn, "SELECT count(*), count(DISTINCT close_id) FROM billing_period_marks WHERE period = %s",
               str(period)) == (partitions, 1)


@pytest.mark.parametrize("sql", [
    "UPDATE statements SET generations = 0", "DELETE FROM statement_totals",
    "UPDATE statement_items SET period = '1970-01'",
    "DELETE FROM billing_periods", "UPDATE billing_period_marks SET closed_at = now()", "TRUNCATE statements"])
async def test_statement_rows_are_written_once(gen, emit, project, conn, bootstrap, sql):
    period = old_period()
    await emit(*sealed(in_period(gen.tenant_id, period)))
    await write_markers(bootstrap, period)
    await project()
    with pytest.raises(psycopg.errors.RestrictViolation):
        conn.execute(sql)


def partition_logs(period: Period, partitions: int) -> list[list]:
    """Per partition: a seal before its marker, the marker, a late seal of the same period after it."""
    close_id, logs = uuid.uuid4(), []
    for partition in range(partitions):
        tenant = f"tenant-{partition % 2}"
        before, after = (gen_in_partition(tenant, period, partition, partitions) for _ in range(2))
        marker = PeriodClosed(period=str(period), partition=partition, partitions=partitions, close_id=close_id,
                              occurred_at=period.end.replace(hour=partition))
        logs.append([*sealed(before, partition + 1), *sealed(after, 10)[:3], marker, after.completed(10)])
    return logs


def statement_tables(conn) -> dict[str, list]:
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3, 4").fetchall()
            for t in ("statement_items", "billing_period_marks", "billing_periods", "statements", "statement_totals")}


async def test_statements_are_the_same_whatever_order_the_partitions_are_applied_in(scratch_database):
    period, partitions = Period(2001, 3), 6
    logs = partition_logs(period, partitions)
    orders = {"one_by_one": [[e] for log in logs for e in log],
              "reversed_in_one_batch": [[e for log in reversed(logs) for e in log]],
              "interleaved": [[log[i] for log in logs if i < len(log)] for i in range(max(map(len, logs)))]}
    seen = {}
    for name, batches in orders.items():
        runner.upgrade(scratch_database, schema=name)
        with connect(scratch_database, name) as conn:
            for batch in batches:
                with conn.transaction():
                    LifecycleProjection().apply(conn, batch)
            seen[name] = statement_tables(conn)
    first = seen["one_by_one"]
    assert first["billing_periods"][0][:5] == ("2001-03", period.end.replace(hour=5), 6, 2, 6)
    assert all(tables == first for tables in seen.values())


async def test_audit_replay_rebuilds_statements_byte_for_byte(gen, emit, bootstrap, scratch_database_url):
    period = old_period()
    late = in_period(gen.tenant_id, period)
    await emit(*sealed(in_period(gen.tenant_id, period), 5), *sealed(late, 3)[:3])
    await write_markers(bootstrap, period)
    await emit(late.completed(3))
    await write_markers(bootstrap, period.next())
    projector = Projector(bootstrap, scratch_database_url, all_projections(Settings()))
    try:
        await projector.catch_up()
    finally:
        projector.close()
    report = await audit_replay(bootstrap, scratch_database_url, Settings())
    assert report.differences == 0, report.as_dict()
    with psycopg.connect(scratch_database_url) as conn:
        live = conn.execute("SELECT * FROM statements WHERE tenant_id = %s ORDER BY period",
                            (gen.tenant_id,)).fetchall()
        shadow = conn.execute("SELECT * FROM audit_checkpoint.statements WHERE tenant_id = %s ORDER BY period",
                              (gen.tenant_id,)).fetchall()
        assert report.rows_compared["statements"] >= 2
    assert [row[:5] for row in live] == [(gen.tenant_id, str(period), live[0][2], 1, 0),
                                         (gen.tenant_id, str(period.next()), live[1][2], 1, 1)]
    assert shadow == live


async def test_a_seal_whose_time_has_no_offset_is_placed_in_its_utc_month_not_refused(scratch_database):
    runner.upgrade(scratch_database, schema="naive")
    g = Gen("tenant-naive", f"gen-{uuid.uuid4().hex[:12]}", clock=Period(2002, 7).start.replace(day=31, hour=23))
    events = sealed(g)
    events[-1] = events[-1].model_copy(update={"occurred_at": events[-1].occurred_at.replace(tzinfo=None)})
    with connect(scratch_database, "naive") as conn:
        with conn.transaction():
            LifecycleProjection().apply(conn, events)
        assert one(conn, "SELECT period, belongs_to FROM statement_items WHERE generation_id = %s",
                   g.generation_id) == ("2002-07", "2002-07")
