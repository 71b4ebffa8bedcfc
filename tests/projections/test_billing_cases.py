"""The billing cases of the seed, each against the real broker and database."""
from projections.lifecycle import LifecycleProjection
from projections.stream_buffer import StreamBufferProjection
from tests.projections.conftest import all_rows, one

BILL = ("SELECT billed_input_tokens, billed_cached_input_tokens, billed_output_tokens, end_reason, usage_label, "
        "reserved_tokens, released_tokens FROM billing_ledger WHERE generation_id = %s")
WATERMARK = ("SELECT processed_input_tokens, cached_input_tokens, generated_output_tokens, recompute_tokens, "
             "reports_counted FROM usage_watermarks WHERE generation_id = %s AND epoch = %s")


async def test_crash_after_120_tokens_with_100_recorded_bills_100(gen, emit, project, conn):
    await emit(gen.admitted(), gen.started(), gen.report(1, 50), gen.report(2, 100))
    await emit(*[gen.tokens(seq, seq) for seq in range(1, 121)])
    await emit(gen.interrupted())
    await project()
    assert one(conn, BILL, gen.generation_id) == (40, 16, 100, "interrupted", "interrupted", 240, 100)
    assert one(conn, "SELECT status, end_reason FROM generations WHERE generation_id = %s",
               gen.generation_id) == ("interrupted", "interrupted")
    assert all_rows(conn, "SELECT kind, generated_output_tokens FROM usage_reconciliation "
                          "WHERE generation_id = %s", gen.generation_id) == [("unbilled_tail", 20)]


async def test_unbilled_tail_is_the_same_when_the_stream_is_projected_after_the_seal(gen, emit, project, conn):
    await emit(gen.admitted(), gen.started(), gen.report(1, 100), gen.interrupted())
    await project(LifecycleProjection())
    assert all_rows(conn, "SELECT kind FROM usage_reconciliation WHERE generation_id = %s", gen.generation_id) == []
    await emit(*[gen.tokens(seq, seq) for seq in range(1, 121)])
    await project(StreamBufferProjection(keep_events=8))
    assert all_rows(conn, "SELECT kind, generated_output_tokens FROM usage_reconciliation "
                          "WHERE generation_id = %s", gen.generation_id) == [("unbilled_tail", 20)]
    assert one(conn, BILL, gen.generation_id)[2] == 100


async def test_the_same_report_twice_counts_once(gen, emit, project, conn):
    report = gen.report(1, 30)
    await emit(gen.admitted(), gen.started(), report, report, gen.report(2, 45))
    await project()
    assert one(conn, WATERMARK, gen.generation_id, 1) == (40, 16, 45, 0, 2)
    assert one(conn, "SELECT count(*) FROM usage_reports WHERE generation_id = %s", gen.generation_id) == (2,)


async def test_a_lower_cumulative_report_leaves_the_watermark(gen, emit, project, conn):
    await emit(gen.admitted(), gen.started(), gen.report(1, 80, recompute=12), gen.report(2, 60, input_tokens=10))
    await project()
    assert one(conn, WATERMARK, gen.generation_id, 1) == (40, 16, 80, 12, 2)


async def test_a_report_after_the_seal_goes_to_reconciliation_only(gen, emit, project, conn):
    late = gen.report(9, 150)
    await emit(gen.admitted(), gen.started(), gen.report(1, 70), gen.completed(70), late, late)
    await project()
    assert one(conn, BILL, gen.generation_id) == (40, 16, 70, "completed", "final", 240, 130)
    assert one(conn, WATERMARK, gen.generation_id, 1)[2] == 70
    assert all_rows(conn, "SELECT kind, report_seq, generated_output_tokens FROM usage_reconciliation "
                          "WHERE generation_id = %s", gen.generation_id) == [("post_seal_report", 9, 150)]


async def test_epoch_2_usage_never_raises_epoch_1(gen, emit, project, conn):
    await emit(gen.admitted(), gen.started(1), gen.report(1, 5, epoch=1), gen.started(2, worker="worker-b"),
               gen.report(1, 90, epoch=2), gen.report(2, 120, epoch=2, input_tokens=40), gen.completed(120, epoch=2))
    await project()
    assert one(conn, WATERMARK, gen.generation_id, 1) == (40, 16, 5, 0, 1)
    assert one(conn, WATERMARK, gen.generation_id, 2) == (40, 16, 120, 0, 2)
    assert one(conn, "SELECT epoch, billed_output_tokens FROM billing_ledger WHERE generation_id = %s",
               gen.generation_id) == (2, 120)


async def test_normal_completion_bills_the_final_watermark(gen, emit, project, conn):
    await emit(gen.admitted(input_tokens=64), gen.started(), gen.report(1, 20, input_tokens=64),
               gen.report(2, 77, input_tokens=64), gen.completed(77, input_tokens=64))
    await project()
    watermark = one(conn, WATERMARK, gen.generation_id, 1)
    bill = one(conn, BILL, gen.generation_id)
    assert (bill[0], bill[1], bill[2]) == (watermark[0], watermark[1], watermark[2]) == (64, 16, 77)
    assert bill[3:] == ("completed", "final", 264, 264 - 64 - 77)
    sealed_hour = gen.clock.replace(minute=0, second=0, microsecond=0)
    assert all_rows(conn, "SELECT hour, generations, input_tokens, output_tokens FROM tenant_usage_hourly "
                          "WHERE tenant_id = %s", gen.tenant_id) == [(sealed_hour, 1, 64, 77)]


async def test_usage_query_sums_only_the_callers_sealed_hours(gen, emit, project, conn):
    from datetime import timedelta

    from projections.queries import tenant_usage
    from tests.projections.conftest import Gen

    second = Gen(tenant_id=gen.tenant_id, generation_id=gen.generation_id + "-2")
    stranger = Gen(tenant_id=gen.tenant_id + "-other", generation_id=gen.generation_id + "-x")
    running = Gen(tenant_id=gen.tenant_id, generation_id=gen.generation_id + "-running")
    await emit(gen.admitted(), gen.started(), gen.completed(10))
    await emit(second.admitted(), second.started(), second.report(1, 7), second.interrupted())
    await emit(stranger.admitted(), stranger.started(), stranger.completed(99))
    await emit(running.admitted(), running.started(), running.report(1, 50))
    await project()
    start = gen.clock - timedelta(hours=1)
    summary = tenant_usage(conn, gen.tenant_id, start, gen.clock + timedelta(hours=1))
    assert summary.totals == {"generations": 2, "inputTokens": 80, "cachedInputTokens": 32, "outputTokens": 17}
    assert tenant_usage(conn, gen.tenant_id, start - timedelta(hours=5), start - timedelta(hours=2)).totals[
        "generations"] == 0


async def test_a_failed_generation_is_billed_at_its_output_so_far_and_releases_the_rest(gen, emit, project, conn):
    await emit(gen.admitted(), gen.started(), gen.report(1, 4), gen.failed(6), gen.report(9, 8))
    await project()
    assert one(conn, "SELECT status, end_reason FROM generations WHERE generation_id = %s",
               gen.generation_id) == ("failed", "failed")
    assert one(conn, BILL, gen.generation_id) == (40, 16, 6, "failed", "final", 240, 240 - 40 - 6)
    assert all_rows(conn, "SELECT kind, report_seq, generated_output_tokens FROM usage_reconciliation "
                          "WHERE generation_id = %s", gen.generation_id) == [("post_seal_report", 9, 8)]
