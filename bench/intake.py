"""`ledgerlm bench intake`: N small requests published at once onto one tenant's intake topic.

    controller, worker(s), intake, results publisher: processes of their own, a control plane of their own
    (fresh controller group) on the running broker; the tiny demo model; a tenant of the bench's own
    publish N records (as the tenant's principal over SASL when the broker has one) ─▶ read llm.results.<t>
    until every request has a result, then a few seconds more so that a second result would show

Reports time to the last result, results/s, CPU seconds of each role per request (from /proc, the intake
and the results publisher as separate processes), and the check that every request has exactly one
result. The tenant's budget either holds the whole batch (`budget: "ample"`) or is tight (`"tight"`,
8 concurrent), so the intake's Retry-After pacing does the work.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.common import spawn, stop_processes, wait_for_log
from bench.proc_cpu import CLK_TCK, process_ticks
from plumbing.compute_threads import wait_policy_env
from plumbing.settings import Settings

SETTLE_S = 3.0
BUDGETS = {"ample": dict(max_tokens_in_flight=100_000_000, tokens_per_minute=1_000_000_000,
                         max_concurrency=1_000_000, max_queued_tokens=100_000_000),
           "tight": dict(max_concurrency=8)}


@dataclass(frozen=True)
class Platform:
    version: str
    tenant_id: str
    tenant_kafka: object  # KafkaAccess or a bootstrap string
    procs: dict[str, subprocess.Popen]
    logs: dict[str, Path]


async def prepare(settings: Settings, model_dir: Path, budget: str, run_id: str):
    """Register the model, create the tenant and its Kafka door; (version, tenant id, tenant's access, env)."""
    from infra.services import LocalServices
    from producers.model_registry import register_model
    from producers.tenant_admin import create_tenant
    from producers.tenant_kafka import grant_kafka, tenant_access
    from schemas.values import TenantLimits

    local = LocalServices(settings)
    plain, db_url = local.kafka_access(), local.endpoints().database_url
    if plain is None or db_url is None:
        raise RuntimeError("no Kafka/PostgreSQL: run `ledgerlm infra up` first")
    version = f"bench-intake-{run_id}@1"
    await register_model(plain, model_dir, version)
    tenant = await create_tenant(plain, db_url, f"bench-intake-{run_id}", TenantLimits(**BUDGETS[budget]))
    admin = local.service_access("admin")
    password = uuid.uuid4().hex
    grant = await grant_kafka(admin, tenant.tenant_id, settings.topic_partitions,
                              settings.topic_replication_factor, password)
    kafka = tenant_access(admin, tenant.tenant_id, password) if grant.principal else plain
    return version, tenant.tenant_id, kafka, plain, db_url, local.principal_env("gateway")


async def start_platform(settings: Settings, model_dir: Path, budget: str, workers: int, workdir: Path) -> Platform:
    from plumbing.kafka.groups import move_group_to_end

    run_id = uuid.uuid4().hex[:8]
    plane = f"bench-intake-{run_id}"
    version, tenant_id, kafka, plain, db_url, sasl_env = await prepare(settings, model_dir, budget, run_id)
    await move_group_to_end(plain, plane, "llm.commands")
    env = {**os.environ, "LEDGERLM_KAFKA_BOOTSTRAP": plain.bootstrap, "LEDGERLM_DATABASE_URL": db_url,
           "LEDGERLM_CONTROLLER_GROUP": plane, **wait_policy_env()}
    workdir.mkdir(parents=True, exist_ok=True)
    commands = {"controller": ["controller"],
                **{f"worker{i}": ["worker", "--model-version", version, "--worker-id", f"{plane}-w{i}"]
                   for i in range(1, workers + 1)},
                "intake": ["intake", "--no-results", "--instance-id", f"{plane}-intake", "--tenant", tenant_id],
                "results": ["intake", "--no-intake", "--instance-id", f"{plane}-intake"]}
    logs = {role: workdir / f"{role}.log" for role in commands}
    procs = {}
    try:
        for role, args in commands.items():
            # A new results group starts at the log's end: from its start it would publish every earlier
            # generation's result again, to other tenants' topics.
            role_env = {**env, **sasl_env, "LEDGERLM_CONTROLLER_START": "latest"} if role in ("intake", "results") \
                else env
            procs[role] = spawn(args, role_env, logs[role])
        await wait_for_log(logs["controller"], "controller owns partitions", procs["controller"], 180)
        for i in range(1, workers + 1):
            await wait_for_log(logs[f"worker{i}"], "worker ready", procs[f"worker{i}"], 180)
        await wait_for_log(logs["intake"], "intake owns partitions", procs["intake"], 180)
        await wait_for_log(logs["results"], "results publisher owns partitions", procs["results"], 180)
    except BaseException:
        stop_processes(list(procs.values()))
        raise
    return Platform(version, tenant_id, kafka, procs, logs)


def requests_for(version: str, count: int, output_tokens: int) -> list[dict]:
    return [{"requestId": f"b-{i:06d}", "model": version, "input": f"item {i}: the water is",
             "maxOutputTokens": output_tokens, "ignoreEos": True} for i in range(count)]


async def collect(kafka, tenant_id: str, want: set[str], timeout_s: float) -> tuple[dict[str, list[dict]], float]:
    """requestId -> every result record it got; and the monotonic time the last wanted one arrived."""
    from plumbing.kafka.clients import make_consumer, partitions_of
    from schemas.intake import results_topic

    consumer = make_consumer(kafka, client_id=f"bench-results-{tenant_id}")
    await consumer.start()
    found: dict[str, list[dict]] = {}
    last_at = float("nan")
    try:
        consumer.assign(await partitions_of(consumer, results_topic(tenant_id)))
        deadline, settle_until = time.monotonic() + timeout_s, None
        while time.monotonic() < (settle_until or deadline):
            for records in (await consumer.getmany(timeout_ms=200, max_records=5000)).values():
                for record in records:
                    result = json.loads(record.value)
                    found.setdefault(result["requestId"], []).append(result)
            if settle_until is None and len(found.keys() & want) == len(want):
                last_at, settle_until = time.monotonic(), time.monotonic() + SETTLE_S
    finally:
        await consumer.stop()
    return found, last_at


def role_ticks(procs: dict[str, subprocess.Popen]) -> dict[str, int | None]:
    return {role: process_ticks(proc.pid) for role, proc in procs.items()}


def held_count(log: Path) -> int:
    return log.read_text(errors="replace").count("intake held")


@dataclass(frozen=True)
class Run:
    """What one run saw: the results, the times (monotonic) and each role's CPU ticks around the batch."""

    count: int
    output_tokens: int
    budget: str
    found: dict[str, list[dict]]
    started: float
    published_s: float
    last_at: float
    ticks_before: dict[str, int | None]
    ticks_after: dict[str, int | None]
    held: int


async def run_intake_bench(model_dir: Path, count: int, output_tokens: int, budget: str, workers: int,
                           workdir: Path, timeout_s: float) -> dict:
    from producers.intake.client import publish_requests

    settings = Settings()
    load_before = [round(x, 2) for x in os.getloadavg()]
    platform = await start_platform(settings, model_dir, budget, workers, workdir)
    try:
        batch = requests_for(platform.version, count, output_tokens)
        ticks_before = role_ticks(platform.procs)
        started = time.monotonic()
        await publish_requests(platform.tenant_kafka, platform.tenant_id, batch)
        published_s = time.monotonic() - started
        found, last_at = await collect(platform.tenant_kafka, platform.tenant_id,
                                       {r["requestId"] for r in batch}, timeout_s)
        run = Run(count, output_tokens, budget, found, started, published_s, last_at, ticks_before,
                  role_ticks(platform.procs), held_count(platform.logs["intake"]))
    finally:
        stop_processes(list(platform.procs.values()))
    return {**report(platform, run), "loadavg_before": load_before,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def report(platform: Platform, run: Run) -> dict:
    mine = {rid: results for rid, results in run.found.items() if rid.startswith("b-")}
    per_request = sorted({len(results) for results in mine.values()})
    statuses: dict[str, int] = {}
    for results in mine.values():
        statuses[results[0]["status"]] = statuses.get(results[0]["status"], 0) + 1
    elapsed = run.last_at - run.started
    cpu = {role: None if run.ticks_before[role] is None or run.ticks_after[role] is None
           else round((run.ticks_after[role] - run.ticks_before[role]) / CLK_TCK, 2) for role in run.ticks_before}
    return {
        "requests": run.count, "output_tokens_per_request": run.output_tokens, "model": platform.version,
        "workers": sum(role.startswith("worker") for role in platform.procs), "budget": run.budget,
        "tenant": platform.tenant_id,
        "authenticated": not isinstance(platform.tenant_kafka, str) and platform.tenant_kafka.uses_sasl,
        "publish_s": round(run.published_s, 2),
        "time_to_last_result_s": round(elapsed, 2),
        "results_per_s": round(run.count / elapsed, 1) if elapsed == elapsed else None,
        "exactly_one_result_each": len(mine) == run.count and per_request == [1],
        "requests_with_a_result": len(mine), "results_per_request_seen": per_request, "statuses": statuses,
        "held_by_retry_after": run.held,
        "cpu_s": cpu,
        "cpu_ms_per_request": {role: None if s is None else round(1000 * s / run.count, 2) for role, s in cpu.items()},
        "setup": "controller, worker(s), intake (--no-results) and results publisher (--no-intake) are processes "
                 "of their own; the projector does not run; the publishing and reading client is this process",
    }
