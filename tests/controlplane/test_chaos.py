"""A short `bench chaos`: every fault once under a small streaming load, on its own 3-broker cluster.

Its stack (3 Kafka brokers, PostgreSQL) lives under `.ledgerlm/test-chaos-stack`, apart from the session's
single-node stack, and is stopped at the end. A service that cannot start fails the test with the reason.

Clients follow their streams for up to the bench's 300 s (`ChaosConfig.client_deadline_s`): with 150 s, a
stress run (2 CPU hogs and an install beside the suite, 2026-12-06) failed with 11 clients that had given up on
generations the worker then completed while the check still waited for them to end: slow under load, not lost.
"""
from __future__ import annotations

from bench.chaos.repeat import ZERO_KEYS
from bench.chaos.run import ChaosConfig, run_chaos_bench
from plumbing.settings import Settings

FAULTS = ["worker_kill9", "broker_kill9", "postgres_restart", "projector_kill9", "projections_dropped_and_rebuilt",
          "usage_duplicates_and_late", "exporter_kill9"]


async def test_every_fault_once_under_load_loses_repeats_and_overbills_nothing(model_dir):
    config = ChaosConfig(home=Settings().home / "test-chaos-stack", model_dir=model_dir, rate=1.5,
                         min_generations=16, output_tokens=24, gap_s=1.5, broker_down_s=4.0, settle_s=60.0)
    report = await run_chaos_bench(config)

    assert {key: report[key] for key in ZERO_KEYS} == dict.fromkeys(ZERO_KEYS, 0), report
    assert [fault["fault"] for fault in report["fault_log"]] == FAULTS
    broker = report["fault_log"][1]
    assert broker["killed"] is True and broker["down_s"] == 4.0
    assert report["generations"]["admitted"] == report["generations"]["started"] >= 16  # every request admitted
    assert report["reports"]["usage_reports_on_log"] > 0 and report["fault_log"][-2]["reports"] > 0
    assert report["export"]["caught_up"] and report["export"]["distinct_delivered"] == report["export"]["sealed"], \
        report["export"]
    assert report["probe"]["acked"] > 0
    topics = report["topics"]
    assert topics["replication_factor"] == 3 and topics["drift"] == 0
    assert {name: topics["min_insync_replicas"][name]
            for name in ("llm.commands", "llm.control-changelog", "llm.generations")} == dict.fromkeys(
        ("llm.commands", "llm.control-changelog", "llm.generations"), "2")


REPLICA_KILLS = ("gateway_kill9", "controller_kill9", "worker_kill9", "projector_kill9")


async def test_two_of_each_role_with_one_of_each_killed_once_loses_repeats_and_overbills_nothing(model_dir):
    """Two of every role on one broker (the shortest stack): kill -9 one gateway, controller, worker, projector;
    the replicas carry the load, clients move to the live gateway, and every count stays 0."""
    config = ChaosConfig(home=Settings().home / "test-chaos-replicas", model_dir=model_dir, brokers=1, instances=2,
                         faults=REPLICA_KILLS, rate=1.5, min_generations=12, output_tokens=16, gap_s=1.5,
                         role_down_s=3.0, settle_s=60.0)
    report = await run_chaos_bench(config)

    assert {key: report[key] for key in ZERO_KEYS} == dict.fromkeys(ZERO_KEYS, 0), report["violations"]
    assert [(f["fault"], f["killed"].replace(f["killed"].rsplit("-", 1)[0], "")) for f in report["fault_log"]] == [
        ("gateway_kill9", "-1"), ("controller_kill9", "-1"), ("worker_kill9", "-w1"), ("projector_kill9", "-1")]
    assert report["generations"]["admitted"] == report["generations"]["started"] >= 12
    availability = report["availability"]
    assert availability["requests_by_kind"]["admission"] >= 12 and availability["requests_by_kind"]["status"] >= 12
    assert report["instances"] == 2 and report["availability_error_fraction"] == availability[
        "availability_error_fraction"]


async def test_the_exporter_killed_mid_batch_and_the_projections_rebuilt_export_every_seal_once(model_dir):
    """One broker, an exporter to the run's OpenMeter contract double: kill -9 it while the receiver holds the
    answer to a batch it stored, start it again, then drop and rebuild the projections (the export ledger is
    kept): every sealed attempt reaches the sink, none after its acknowledgement was recorded."""
    config = ChaosConfig(home=Settings().home / "test-chaos-exporter", model_dir=model_dir, brokers=1,
                         faults=("exporter_kill9", "projections_dropped_and_rebuilt"), rate=1.5, min_generations=12,
                         output_tokens=16, gap_s=1.5, settle_s=60.0)
    report = await run_chaos_bench(config)

    assert {key: report[key] for key in ZERO_KEYS} == dict.fromkeys(ZERO_KEYS, 0), report["violations"]
    kill, rebuild = report["fault_log"]
    assert kill["fault"] == "exporter_kill9" and kill["mid_batch"] is True and kill["batch_in_flight"] > 0
    assert rebuild["export_rows_kept"] > 0
    exported = report["export"]
    assert exported["caught_up"] and exported["sealed"] >= 12
    assert exported["distinct_delivered"] == exported["acknowledged"] == exported["sealed"]
    assert exported["redelivered"] >= 1  # the held batch went again, under the same ids
    assert report["role_restarts"]["exporter"] == 0  # the kill restarted it, not the supervisor
