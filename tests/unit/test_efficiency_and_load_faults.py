"""The efficiency bench's arithmetic, and the chaos run's load-like faults on real processes."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from bench.chaos.faults import FaultLog
from bench.chaos.fleet import LOAD_FAULTS, faults_for
from bench.chaos.load_faults import cpu_hog, freeze_pid
from bench.efficiency.run import check, compare, outside_engine, role_costs
from tests.waiting import wait_until


def test_role_costs_subtract_the_idle_burn_and_divide_by_output_tokens():
    costs = role_costs({"gateway": 3.0, "kafka": None}, {"gateway": 0.05}, wall_s=20.0, tokens=1000)
    assert costs["gateway"] == {"cpu_s": 3.0, "cores": 0.15, "ms_per_output_token": 2.0}  # (3 - 1) s / 1000
    assert costs["kafka"] == {"cpu_s": None, "cores": None, "ms_per_output_token": None}


def test_outside_engine_sums_every_role_beside_the_engine_thread_or_says_it_cannot():
    costs = {role: {"ms_per_output_token": 0.5} for role in
             ("gateway", "controller", "projector", "worker_other", "kafka", "postgres")}
    assert outside_engine(costs) == 3.0
    costs["postgres"] = {"ms_per_output_token": None}
    assert outside_engine(costs) is None


def level(concurrency: int, tok_s: float, itl_p95: float, outside: float | None = None) -> dict:
    return {"concurrency": concurrency, "output_tok_s": tok_s, "itl_ms": {"p50": 1, "p95": itl_p95},
            "ttft_ms": {"p50": 1, "p95": 2}, "refused_429": 0, "refused_503": 0, "other": 0,
            "outside_engine_ms_per_output_token": outside}


def test_compare_and_check_judge_each_level_against_the_engine_alone():
    rows = compare([level(1, 9.0, 115.0, 1.5), level(8, 20.0, 300.0, 1.2)], [level(1, 10.0, 100.0), level(8, 28.0, 200.0)])
    assert [(r["tok_s_ratio"], r["itl_p95_ratio"]) for r in rows] == [(0.9, 1.15), (0.714, 1.5)]
    met = check(rows, {"cores": 0.04}, {"cores": 0.06})
    assert met["tok_s_ratio_at_1"] is True and met["tok_s_ratio_at_8"] is False and met["tok_s_ratio_at_4"] is None
    assert met["itl_p95_ratio_at_1"] is True and met["itl_p95_ratio_at_8"] is False
    assert met["outside_engine_ms_per_token_at_1"] is True and met["outside_engine_ms_per_token_at_8"] is False
    assert (met["idle_cores_before"], met["idle_cores_after"]) == (True, False)


def test_load_faults_run_only_when_named():
    assert not set(LOAD_FAULTS) & set(faults_for(1, None)) and not set(LOAD_FAULTS) & set(faults_for(2, None))
    assert faults_for(1, ("cpu_hog", "worker_freeze")) == ("cpu_hog", "worker_freeze")


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def test_a_frozen_process_is_stopped_for_the_freeze_and_running_after_it_even_when_cut_short():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        freezing = asyncio.create_task(freeze_pid(proc.pid, 60))  # far longer than the test: it is cancelled
        await wait_until(lambda: state_of(proc.pid) == "T", 10, what="the process stopped")
        freezing.cancel()
        await asyncio.gather(freezing, return_exceptions=True)
        assert state_of(proc.pid) in ("S", "R", "D")  # running again (D: a moment of disk wait, on a busy machine)
    finally:
        proc.kill()
        proc.wait()


async def test_the_cpu_hog_runs_its_processes_and_logs_the_fault():
    journal = FaultLog()
    await cpu_hog(journal, seconds=0.3, per_core=1)
    [fault] = journal.faults
    assert fault["fault"] == "cpu_hog" and fault["processes"] >= 1 and fault["seconds"] == 0.3


def test_the_page_shows_one_row_per_level_with_its_ratio_and_the_idle_burn():
    from datetime import date

    from bench.efficiency.page import efficiency_page

    rows = compare([level(1, 9.0, 115.0, 1.5)], [level(1, 10.0, 100.0)])
    roles = {r: {"cores": 0.1, "ms_per_output_token": 0.2} for r in
             ("gateway", "controller", "projector", "worker_engine", "worker_other", "kafka", "postgres")}
    idle = {"cores": 0.04, "cores_by_role": {"kafka": 0.02}}
    report = {"comparison": rows, "machine": {"cpus": 2, "load_average_at_start": [0.1], "load_average_at_end": [1.0]},
              "model_dir": "/x/smollm2-135m-instruct@1", "wall_s": 100.0, "targets_met": check(rows, idle, idle),
              "platform": {"levels": [{"concurrency": 1, "roles": roles}], "idle_before": idle, "idle_after": idle},
              "not_measured": ["Kafka fetch requests"]}
    page = efficiency_page(report, date(2026, 12, 1))
    assert page.startswith("# bench efficiency, 2026-12-01")
    assert "| 1 | 9.0 | 10.0 | 0.9 | 1/115.0 | 1/100.0 | 1.15 |" in page
    assert "0.04 cores before the load, 0.04 after" in page and "kafka 0.02" in page


def test_kafka_request_rates_are_per_role_per_api_differences_over_the_phase():
    from bench.efficiency.kafka_rates import parse_requests, request_rates

    text = ('ledgerlm:kafka_requests_total{api="Fetch",client="gateway-bridge"} 10.0\n'
            'ledgerlm:kafka_requests_total{api="Fetch",client="gateway-workers"} 4.0\n'
            'ledgerlm:kafka_requests_total{api="Produce",client="gw-1"} 2.0\n'
            'ledgerlm:http_responses_total{code="200"} 9.0\n')
    assert parse_requests(text) == {"Fetch": 14.0, "Produce": 2.0}
    before = {"gateway": {"Fetch": 14.0, "Produce": 2.0}, "worker": None}
    after = {"gateway": {"Fetch": 34.0, "Produce": 2.0, "Heartbeat": 1.0}, "worker": {"Fetch": 3.0}}
    assert request_rates(before, after, 10.0) == {"gateway": {"Fetch": 2.0, "Heartbeat": 0.1, "total": 2.1},
                                                  "worker": None}
