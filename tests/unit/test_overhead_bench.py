"""The overhead bench's pure parts: /proc parsing, CPU per role, per-request arithmetic, Kafka and Postgres deltas."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bench.overhead import report
from bench.overhead.kafka import TopicSnapshot, log_dirs_of, topic_deltas, topic_of
from bench.overhead.load import Mix, fitted, usage_of
from bench.overhead.postgres import caught_up, row_deltas, table_name
from bench.proc_cpu import CLK_TCK, ProcStat, cpu_seconds, parse_stat, tree_ticks
from consumers.worker.engine_thread import name_native_thread


def make_stat(pid: int, ppid: int, utime: int, stime: int = 0, cutime: int = 0, cstime: int = 0) -> ProcStat:
    return ProcStat(pid=pid, comm="postgres", ppid=ppid, utime=utime, stime=stime, cutime=cutime, cstime=cstime)


def test_parse_stat_reads_ticks_after_a_name_with_spaces_and_parentheses():
    line = "4242 (postgres: walwriter (x)) S 4100 4100 4100 0 -1 4194624 311 0 0 0 150 30 7 2 20 0 1 0 " \
           "2195 227778560 1234 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0"
    assert parse_stat(line) == ProcStat(pid=4242, comm="postgres: walwriter (x)", ppid=4100, utime=150, stime=30,
                                        cutime=7, cstime=2)
    assert parse_stat(line).own_ticks == 180
    assert parse_stat(line).total_ticks == 189


def test_tree_ticks_sums_the_root_with_what_it_reaped_and_every_live_descendant():
    stats = [make_stat(100, 1, 10, 5, cutime=40, cstime=3),  # postmaster; 43 ticks of exited backends
             make_stat(101, 100, 20), make_stat(102, 100, 7, 1), make_stat(103, 102, 2),
             make_stat(200, 1, 999)]  # not in the tree
    assert tree_ticks(100, stats) == 58 + 20 + 8 + 2
    assert tree_ticks(555, stats) is None


def test_cpu_seconds_is_the_tick_delta_and_none_where_a_sample_missed():
    before = {"gateway": 100, "kafka": None, "postgres": 50}
    after = {"gateway": 100 + 3 * CLK_TCK, "kafka": 500, "postgres": None}
    assert cpu_seconds(before, after) == {"gateway": 3.0, "kafka": None, "postgres": None}


def test_split_worker_separates_the_engine_threads():
    cpu = report.split_worker({"gateway": 1.0, "worker": 5.0, "worker_engine": 4.25})
    assert cpu == {"gateway": 1.0, "engine": 4.25, "worker_non_engine": 0.75}
    assert report.split_worker({"worker": None, "worker_engine": 1.0})["worker_non_engine"] is None


def test_costs_per_request_per_token_and_net_of_idle():
    cpu = {"gateway": 2.0, "controller": 1.0, "projector": 1.0, "worker_non_engine": 0.5, "kafka": 3.0,
           "postgres": 2.5, "engine": 6.0, "load_generator": 0.4}
    idle = {"gateway": 0.01, "kafka": 0.05}
    costs = report.costs(cpu, idle, requests=200, output_tokens=12_800, wall_s=20.0)
    assert costs["roles"]["gateway"] == {"cpu_s": 2.0, "cores": 0.1, "ms_per_request": 10.0,
                                         "us_per_output_token": 156.2, "ms_per_request_net_of_idle": 9.0}
    assert costs["roles"]["kafka"]["ms_per_request_net_of_idle"] == 10.0  # (3.0 - 0.05 * 20) / 200
    assert costs["roles"]["controller"]["ms_per_request_net_of_idle"] is None  # no idle sample
    # engine and load generator are not platform
    assert costs["platform"] == {"cpu_s": 10.0, "cores": 0.5, "ms_per_request": 50.0, "us_per_output_token": 781.2,
                                 "ms_per_request_net_of_idle": 44.0, "missing_roles": []}
    assert report.top_roles(costs["roles"]) == [["kafka", 15.0], ["postgres", 12.5], ["gateway", 10.0]]


def test_costs_name_missing_roles_and_zero_requests_give_none():
    costs = report.costs({"gateway": 1.0, "kafka": None}, {}, requests=0, output_tokens=0, wall_s=1.0)
    assert costs["platform"]["ms_per_request"] is None
    assert costs["platform"]["missing_roles"] == ["controller", "projector", "worker_non_engine", "kafka", "postgres"]


def test_targets_and_linear_fit():
    assert report.target_ms_per_request(64) == 34.6
    assert report.linear_fit([(16, 27.4), (64, 34.6), (128, 44.2)]) == {"fixed_ms": 25.0, "us_per_output_token": 150.0}
    assert report.linear_fit([(64, 30.0), (64, 31.0)]) is None


def test_per_unit_rates():
    rows = report.per_unit({"public.generations": {"inserted": 96, "updated": 578, "deleted": 0, "written": 674}},
                           requests=96, output_tokens=6144, keys=["written"])
    assert rows == {"public.generations": {"inserted": 96, "updated": 578, "deleted": 0, "written": 674,
                                           "written_per_request": 7.021, "written_per_output_token": 0.1097}}
    assert report.summed(rows, "written") == 674


def test_row_deltas_and_temporary_table_names():
    before = {"public.generations": (10, 20, 0), "public.tenants": (1, 0, 0)}
    after = {"public.generations": (106, 598, 0), "public.tenants": (1, 0, 0), "pg_temp.stage": (5, 0, 5)}
    assert row_deltas(before, after) == {
        "pg_temp.stage": {"inserted": 5, "updated": 0, "deleted": 5, "written": 10},
        "public.generations": {"inserted": 96, "updated": 578, "deleted": 0, "written": 674}}
    assert table_name("pg_temp_3", "stream_events_stage") == "pg_temp.stream_events_stage"
    assert table_name("public", "generations") == "public.generations"


def test_caught_up_allows_one_commit_marker_and_nothing_more():
    ends = {("llm.generations", 0): 11, ("llm.generations", 1): 0}
    assert caught_up({("llm.generations", 0): 10}, ends)
    assert not caught_up({("llm.generations", 0): 9}, ends)
    assert not caught_up({}, {("llm.tokens", 0): 1})


def test_kafka_topic_names_log_dirs_and_deltas():
    assert topic_of("llm.control-changelog-3") == "llm.control-changelog"
    assert topic_of("__consumer_offsets-0") == "__consumer_offsets"
    assert topic_of("cleaner-offset-checkpoint") is None
    assert log_dirs_of("node.id=1\nlog.dirs=/a/data, /b/data\n") == [Path("/a/data"), Path("/b/data")]
    before = TopicSnapshot({"llm.tokens": 100, "llm.dlq": 0},
                           {"llm.tokens": 5000, "llm.dlq": 0, "__cluster_metadata": 10})
    after = TopicSnapshot({"llm.tokens": 160, "llm.dlq": 0},
                          {"llm.tokens": 9000, "llm.dlq": 0, "__cluster_metadata": 30})
    assert topic_deltas(before, after) == {"__cluster_metadata": {"records": None, "bytes": 20},
                                           "llm.tokens": {"records": 60, "bytes": 4000}}


def test_longer_mix_shrinks_to_fit_a_small_context():
    assert fitted(Mix("longer", 1024, 256), 8192) == (Mix("longer", 1024, 256), None)
    mix, note = fitted(Mix("longer", 1024, 256), 512)
    assert mix == Mix("longer", 384, 128) and "512" in note
    with pytest.raises(ValueError):
        fitted(Mix("default", 256, 64), 256)


def test_usage_of_a_streamed_chat_completion():
    lines = ['data: {"choices":[{"index":0,"delta":{"content":"a"}}]}', "",
             'data: {"choices":[],"usage":{"prompt_tokens":256,"completion_tokens":64,"total_tokens":320}}', "",
             "data: [DONE]"]
    assert usage_of(lines) == ({"prompt_tokens": 256, "completion_tokens": 64, "total_tokens": 320}, None)
    assert usage_of(['data: {"error":{"code":"deadline_exceeded"}}', "data: [DONE]"]) == (None, "deadline_exceeded")


def test_engine_thread_names_its_os_thread():
    seen = {}

    def body() -> None:
        name_native_thread("engine")
        seen["comm"] = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen["comm"] == "engine"
