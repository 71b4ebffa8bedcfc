"""The engine thread's step and stall seconds, their metric, and the efficiency bench's reading of them."""
from __future__ import annotations

from bench.efficiency.engine_timing import parse_timing, stall_share
from consumers.worker.engine_thread import EngineTiming
from plumbing.telemetry.metrics import WorkerMetrics


def test_a_gap_counts_as_stalled_only_after_a_step_that_left_work_unfinished():
    timing = EngineTiming()
    timing.stepped(10.0, 10.1, still_busy=True)
    timing.stepped(10.3, 10.4, still_busy=False)  # 0.2 s stalled: work was waiting
    timing.stepped(20.0, 20.5, still_busy=True)  # after idleness: nothing stalled
    timing.stepped(20.55, 20.6, still_busy=True)
    assert round(timing.step_s, 6) == 0.75
    assert round(timing.stalled_s, 6) == 0.25


def test_the_worker_exposes_the_timing_and_the_bench_reads_its_share():
    timing = EngineTiming()
    timing.stepped(0.0, 3.0, still_busy=True)
    timing.stepped(4.0, 6.0, still_busy=False)
    metrics = WorkerMetrics(lambda: None, lambda: 0, timing=lambda: timing)
    from prometheus_client import generate_latest

    after = parse_timing(generate_latest(metrics.registry).decode())
    assert after == {"step_s": 5.0, "stalled_s": 1.0}
    share = stall_share({"step_s": 1.0, "stalled_s": 0.0}, after)
    assert share == {"step_s": 4.0, "stalled_s": 1.0, "stalled_share": 0.2}
    assert stall_share(None, after) is None
    assert stall_share(after, after)["stalled_share"] is None
