"""A batch applied in waves leaves exactly the rows of applying its events one by one (real PostgreSQL)."""
import random
from datetime import UTC, datetime

import psycopg

from projections.lifecycle import LifecycleProjection, waves
from projections.refused import apply_refusing
from schemas.lifecycle import Admitted, Canceled, CancelRequested, Expired
from tests.projections.conftest import Gen

T0 = datetime(2026, 3, 1, 9, 59, 59, tzinfo=UTC)
TABLES = {"generations": "generation_id", "attempts": "generation_id", "usage_watermarks": "generation_id",
          "usage_reports": "generation_id", "billing_ledger": "generation_id",
          "usage_reconciliation": "generation_id", "tenant_usage_hourly": "tenant_id",
          "statement_items": "generation_id"}


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

def disordered_lifecycle(g: Gen, rng: random.Random) -> list:
    """One generation's events as faults leave them on the log: the controller's Interrupted appended (and dated)
    before the worker's AttemptStarted of the same epoch, an epoch's start delayed past a later epoch's events,
    events delayed past later ones (a produce retried after a failover) and repeated (a retry whose first try was
    written), second endings and reports after the seal."""
    events = [g.admitted()]
    events += [g.interrupted(), g.started()] if rng.random() < 0.3 else [g.started()]
    epoch = 1
    if rng.random() < 0.5:
        events.append(g.report(1, rng.randint(1, 30)))
    if rng.random() < 0.3:
        events.append(CancelRequested(tenant_id=g.tenant_id, generation_id=g.generation_id, occurred_at=g._at()))
    if rng.random() < 0.4:  # the first attempt was lost, a second one runs
        events += [g.interrupted(), g.started(epoch=2, worker="worker-b"), g.report(1, rng.randint(1, 30), epoch=2)]
        epoch = 2
    events.append(g.report(2, rng.randint(30, 60), epoch=rng.choice((1, epoch))))
    for _ in range(rng.choice((1, 1, 2))):
        events.append(ending(g, rng, epoch))
    if rng.random() < 0.3:
        events.append(g.report(3, 99, epoch=epoch))
    for _ in range(rng.randint(0, 3)):  # delayed past later events
        i = rng.randrange(len(events))
        events.insert(rng.randint(i, len(events) - 1), events.pop(i))
    for _ in range(rng.randint(0, 2)):  # written twice
        i = rng.randrange(len(events))
        events.insert(rng.randint(i + 1, len(events)), events[i])
    return events


def ending(g: Gen, rng: random.Random, epoch: int):
    kind = rng.choice(("completed", "failed", "interrupted", "stale", "canceled", "expired"))
    scoped = {"tenant_id": g.tenant_id, "generation_id": g.generation_id}
    return {"completed": lambda: g.completed(rng.randint(40, 80), epoch=epoch),
            "failed": lambda: g.failed(rng.randint(1, 40), epoch=epoch),
            "interrupted": lambda: g.interrupted(epoch=epoch),
            "stale": lambda: g.interrupted(epoch=1),
            "canceled": lambda: Canceled(**scoped, epoch=epoch, occurred_at=g._at()),
            "expired": lambda: Expired(**scoped, occurred_at=g._at())}[kind]()


def disordered_log(prefix: str, seed: int, generations: int = 4) -> list:
    """The same log (times, counts, order) for every prefix: the generations' events randomly interleaved."""
    rng = random.Random(seed)
    logs = [disordered_lifecycle(Gen(f"{prefix}-tenant", f"{prefix}-g{n}", T0), rng) for n in range(generations)]
    out = []
    while any(logs):
        out.append(rng.choice([log for log in logs if log]).pop(0))
    return out


def apply_split(conn: psycopg.Connection, events: list, boundaries: list[int]) -> list[str]:
    """One transaction per batch, the batches cut at `boundaries`; the ids of the events refused."""
    cuts, refused = [0, *sorted(set(boundaries)), len(events)], []
    for start, end in zip(cuts, cuts[1:]):
        with conn.transaction():
            refused += [e.event_id for e, _ in apply_refusing(conn, LifecycleProjection(), events[start:end])]
    return refused


def test_every_split_of_a_disordered_log_leaves_the_rows_of_event_by_event(scratch_database_url):
    """40 disordered logs, each applied event by event, whole, and cut at random places; and three of them cut
    at every single place. The rows never depend on where the batches end."""
    with psycopg.connect(scratch_database_url, autocommit=True) as conn:
        for seed in range(40):
            length = len(disordered_log("x", seed))
            rng = random.Random(1000 + seed)
            splits = [list(range(1, length)), [], *[rng.sample(range(1, length), rng.randint(1, length // 3))
                                                    for _ in range(2)]]
            if seed < 3:
                splits += [[k] for k in range(1, length)]
            assert apply_split(conn, disordered_log(f"s{seed:02d}e", seed), splits[0]) == []
            one_by_one = rows(conn, f"s{seed:02d}e")
            for n, boundaries in enumerate(splits[1:]):
                prefix = f"s{seed:02d}b{n:03d}"
                assert apply_split(conn, disordered_log(prefix, seed), boundaries) == []
                assert rows(conn, prefix) == one_by_one, (seed, boundaries)


def test_wave_k_holds_the_kth_event_of_each_generation_in_log_order():
    a, b = Gen("t", "a", T0), Gen("t", "b", T0)
    events = [a.admitted(), b.admitted(), a.started(), a.report(1, 5), b.started(), a.completed(5)]
    assert [[(e.generation_id, e.type) for e in wave] for wave in waves(events)] == [
        [("a", "Admitted"), ("b", "Admitted")],
        [("a", "AttemptStarted"), ("b", "AttemptStarted")],
        [("a", "UsageReported")],
        [("a", "Completed")],
    ]
