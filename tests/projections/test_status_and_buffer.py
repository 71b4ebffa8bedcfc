"""Generation status state machine, attempts, and the resume buffer."""
from datetime import timedelta

import psycopg

from projections.lifecycle import LifecycleProjection
from projections.runtime import Projector
from projections.stream_buffer import StreamBufferProjection
from schemas.lifecycle import CancelRequested, Canceled, Expired
from schemas.values import Usage
from tests.projections.conftest import all_rows, one

STATUS = ("SELECT status, current_epoch, worker_id, cancel_requested, end_reason, generated_output_tokens "
          "FROM generations WHERE generation_id = %s")


async def test_status_follows_the_lifecycle(gen, emit, project, conn):
    await emit(gen.admitted())
    await project(LifecycleProjection())
    assert one(conn, STATUS, gen.generation_id) == ("admitted", 1, None, False, None, 0)
    await emit(gen.started(), gen.report(1, 12))
    await project(LifecycleProjection())
    assert one(conn, STATUS, gen.generation_id) == ("running", 1, "worker-a", False, None, 12)
    await emit(CancelRequested(tenant_id=gen.tenant_id, generation_id=gen.generation_id, epoch=1),
               Canceled(tenant_id=gen.tenant_id, generation_id=gen.generation_id, epoch=1,
                        usage=Usage(processed_input_tokens=40, cached_input_tokens=16, generated_output_tokens=13)),
               gen.completed(99))  # a terminal event after the first one changes nothing
    await project(LifecycleProjection())
    assert one(conn, STATUS, gen.generation_id) == ("canceled", 1, "worker-a", True, "canceled", 13)
    assert one(conn, "SELECT end_reason, billed_output_tokens FROM billing_ledger WHERE generation_id = %s",
               gen.generation_id) == ("canceled", 13)
    assert all_rows(conn, "SELECT epoch, worker_id, end_reason FROM attempts WHERE generation_id = %s",
                    gen.generation_id) == [(1, "worker-a", "canceled")]


async def test_a_stale_epoch_does_not_change_the_current_attempt(gen, emit, project, conn):
    await emit(gen.admitted(), gen.started(1, "worker-a"), gen.started(2, "worker-b"),
               gen.interrupted(epoch=1), gen.started(1, "worker-a"))
    await project(LifecycleProjection())
    assert one(conn, STATUS, gen.generation_id) == ("running", 2, "worker-b", False, None, 0)
    assert all_rows(conn, "SELECT epoch, worker_id, end_reason FROM attempts WHERE generation_id = %s "
                          "ORDER BY epoch", gen.generation_id) == [(1, "worker-a", "interrupted"),
                                                                  (2, "worker-b", None)]
    assert one(conn, "SELECT count(*) FROM billing_ledger WHERE generation_id = %s", gen.generation_id) == (0,)


async def test_expired_before_start_seals_zero_and_releases_everything(gen, emit, project, conn):
    await emit(gen.admitted(input_tokens=10, max_output_tokens=90),
               Expired(tenant_id=gen.tenant_id, generation_id=gen.generation_id))
    await project(LifecycleProjection())
    assert one(conn, "SELECT status, end_reason FROM generations WHERE generation_id = %s",
               gen.generation_id) == ("expired", "expired")
    assert one(conn, "SELECT billed_input_tokens, billed_output_tokens, reserved_tokens, released_tokens "
                     "FROM billing_ledger WHERE generation_id = %s", gen.generation_id) == (0, 0, 100, 100)


async def test_resume_buffer_keeps_the_last_n_events_and_the_final_one(gen, emit, project, conn):
    await emit(*[gen.tokens(seq, seq) for seq in range(1, 11)], gen.finished(11, output=10))
    await project(StreamBufferProjection(keep_events=4))
    rows = all_rows(conn, "SELECT seq, is_final, end_reason FROM stream_events WHERE generation_id = %s "
                          "ORDER BY seq", gen.generation_id)
    assert rows == [(8, False, None), (9, False, None), (10, False, None), (11, True, "completed")]
    assert one(conn, "SELECT epoch, last_seq, oldest_seq, token_count, end_reason FROM stream_progress "
                     "WHERE generation_id = %s", gen.generation_id) == (1, 11, 8, 10, "completed")


async def test_resume_buffer_drops_stale_epochs_and_clears_on_a_new_epoch(gen, emit, project, conn):
    await emit(gen.tokens(1, 1, epoch=1), gen.tokens(2, 2, epoch=1))
    await project(StreamBufferProjection(keep_events=100))
    await emit(gen.tokens(1, 1, epoch=2), gen.tokens(3, 3, epoch=1), gen.tokens(2, 2, epoch=2))
    await project(StreamBufferProjection(keep_events=100))
    assert all_rows(conn, "SELECT epoch, seq FROM stream_events WHERE generation_id = %s ORDER BY seq",
                    gen.generation_id) == [(2, 1), (2, 2)]


async def test_an_ended_stream_is_trimmed_after_its_retention_in_log_time(gen, emit, bootstrap,
                                                                         projection_db):
    # Events stamped in the past, never the future: a future log time would trim every stream after it.
    # The scratch database keeps other tests' streams out of this one's assertions.
    gen.clock -= timedelta(hours=2)
    await emit(gen.tokens(1, 1), gen.finished(2, output=1))
    other = type(gen)(tenant_id=gen.tenant_id, generation_id=gen.generation_id + "-later")
    await emit(other.tokens(1, 1))
    projector = Projector(bootstrap, projection_db,
                          [StreamBufferProjection(keep_events=100, keep_after_end=timedelta(hours=1))])
    try:
        await projector.catch_up()
    finally:
        projector.close()
    conn = psycopg.connect(projection_db, autocommit=True)
    assert one(conn, "SELECT count(*) FROM stream_events WHERE generation_id = %s", gen.generation_id) == (0,)
    assert one(conn, "SELECT oldest_seq, last_seq FROM stream_progress WHERE generation_id = %s",
               gen.generation_id) == (3, 2)
    assert one(conn, "SELECT count(*) FROM stream_events WHERE generation_id = %s", other.generation_id) == (1,)
    conn.close()
