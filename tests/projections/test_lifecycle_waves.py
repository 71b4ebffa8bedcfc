"""A batch applied in waves leaves exactly the rows of applying its events one by one (real PostgreSQL)."""
from datetime import UTC, datetime

import psycopg

from projections.lifecycle import LifecycleProjection, waves
from projections.refused import apply_refusing
from schemas.lifecycle import Admitted, Canceled, CancelRequested
from tests.projections.conftest import Gen

T0 = datetime(2026, 3, 1, 9, 59, 59, tzinfo=UTC)
TABLES = {"generations": "generation_id", "attempts": "generation_id", "usage_watermarks": "generation_id",
          "usage_reports": "generation_id", "billing_ledger": "generation_id",
          "usage_reconciliation": "generation_id", "tenant_usage_hourly": "tenant_id"}


def lifecycles(prefix: str) -> list[list]:
    """Seven generations' logs: retries, stale attempts, redeliveries, post-seal reports, a refused event."""
    g = {n: Gen(f"{prefix}-tenant", f"{prefix}-g{n}", T0) for n in range(1, 8)}
    return [
        [g[1].admitted(), g[1].started(), g[1].report(1, 10), g[1].report(2, 30), g[1].completed(35)],
        [g[2].admitted(), g[2].started(), g[2].report(1, 20), g[2].started(epoch=2, worker="worker-b"),
         g[2].started(epoch=1), g[2].report(1, 5, epoch=2), g[2].interrupted(epoch=1), g[2].completed(50, epoch=2),
         g[2].report(3, 70, epoch=2)],
        [g[3].admitted(), g[3].started(), g[3].report(1, 100), g[3].interrupted()],
        [g[4].admitted(), Canceled(tenant_id=g[4].tenant_id, generation_id=g[4].generation_id, occurred_at=T0)],
        [g[5].admitted(), g[5].started(), CancelRequested(tenant_id=g[5].tenant_id, generation_id=g[5].generation_id,
                                                          occurred_at=T0),
         g[5].failed(12), g[5].completed(40)],
        [g[6].admitted(input_tokens=2**40), g[6].started(), g[6].completed(3)],
        [g[7].report(1, 9), g[7].completed(9)],
    ]


def interleaved(logs: list[list]) -> list:
    out, logs = [], [list(log) for log in logs]
    while any(logs):
        out += [log.pop(0) for log in logs if log]
    return out


def project(conn: psycopg.Connection, prefix: str, batch_size: int) -> list[str]:
    conn.execute("INSERT INTO stream_progress (generation_id, tenant_id, epoch, last_seq, oldest_seq, token_count, "
                 "updated_at) VALUES (%s, %s, 1, 120, 1, 120, %s)", (f"{prefix}-g3", f"{prefix}-tenant", T0))
    events, refused = interleaved(lifecycles(prefix)), []
    for start in range(0, len(events), batch_size):
        with conn.transaction():
            refused += [e.generation_id for e, _ in apply_refusing(conn, LifecycleProjection(),
                                                                   events[start:start + batch_size])]
    return refused


def rows(conn: psycopg.Connection, prefix: str) -> dict[str, list[str]]:
    return {table: sorted(repr(row).replace(f"{prefix}-", "P-") for row in conn.execute(
        f"SELECT * FROM {table} WHERE {key} LIKE %s", (f"{prefix}-%",)))
        for table, key in TABLES.items()}


def test_a_batch_in_waves_leaves_the_rows_of_event_by_event(scratch_database_url):
    with psycopg.connect(scratch_database_url, autocommit=True) as conn:
        assert project(conn, "one", batch_size=1) == ["one-g6"]
        assert project(conn, "all", batch_size=1000) == ["all-g6"]
        assert project(conn, "some", batch_size=4) == ["some-g6"]
        one_by_one = rows(conn, "one")
        assert rows(conn, "all") == one_by_one
        assert rows(conn, "some") == one_by_one
        bills = conn.execute("SELECT generation_id, end_reason, billed_output_tokens FROM billing_ledger "
                             "WHERE generation_id LIKE 'all-%%' ORDER BY 1").fetchall()
        assert bills == [("all-g1", "completed", 35), ("all-g2", "completed", 50), ("all-g3", "interrupted", 100),
                         ("all-g4", "canceled", 0), ("all-g5", "failed", 12)]
        late = conn.execute("SELECT generation_id, kind, generated_output_tokens FROM usage_reconciliation "
                            "WHERE generation_id LIKE 'all-%%' ORDER BY 1").fetchall()
        assert late == [("all-g2", "post_seal_report", 70), ("all-g3", "unbilled_tail", 20)]

def test_wave_k_holds_the_kth_event_of_each_generation_in_log_order():
    a, b = Gen("t", "a", T0), Gen("t", "b", T0)
    events = [a.admitted(), b.admitted(), a.started(), a.report(1, 5), b.started(), a.completed(5)]
    assert [[(e.generation_id, e.type) for e in wave] for wave in waves(events)] == [
        [("a", "Admitted"), ("b", "Admitted")],
        [("a", "AttemptStarted"), ("b", "AttemptStarted")],
        [("a", "UsageReported")],
        [("a", "Completed")],
    ]
