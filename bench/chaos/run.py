"""`ledgerlm bench chaos --json PATH`: faults under a steady streaming load; afterwards, counts that must be 0.

    own stack under <home>/chaos-stack: 3-broker KRaft cluster (RF 3, min ISR 2) + PostgreSQL, free ports
    roles as real processes under a supervisor: controller, worker, projector, gateway (HTTP on 127.0.0.1),
             or `instances` of each (bench/chaos/fleet.py)
    load:    a streaming client every 1/rate s, two tenants; each resumes with Last-Event-ID when cut, on
             another gateway when its own is down; every request tallied (bench/chaos/gateways.py)
    faults:  one after another, `gap_s` apart, while the load runs (bench/chaos/faults.py)
    checks:  stuck, audit_differences, overbilled, duplicate_seqs, missing_seqs, unreleased_reservations,
             lost_events (bench/chaos/checks.py); with `exporter_kill9`, export_missing, export_duplicates,
             export_unknown, export_reconcile_differences (bench/chaos/export.py); every violation behind a
             count, with its evidence and the nearest fault, under `violations` (bench/chaos/violations.py)

The stack is fresh every run (its log is short, so the replay audit is quick)
and stopped at the end, whatever happened.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.chaos import checks, export, faults
from bench.chaos.clients import ClientResult, SteadyLoad
from bench.chaos.fleet import Fleet, LoadFaultTimes, build_fleet, fault_steps, faults_for, wait_started
from bench.chaos.gateways import Availability
from bench.chaos.roles import Role, stop_all, supervise
from bench.chaos.violations import place
from infra.services import LocalServices
from plumbing.settings import Settings
from schemas.topics import DAY_MS, TOKENS, TopicSpec

PROBE_SPEC = TopicSpec(faults.PROBE_TOPIC, "key", (), "delete", DAY_MS, partitions=3, min_insync_replicas=2,
                       description="acks=all probe records of the chaos run")
log = logging.getLogger("ledgerlm.chaos")
ROLE_ENV = {
    "LEDGERLM_LEASE_MS": "3000",
    "LEDGERLM_HEARTBEAT_INTERVAL_MS": "250",
    "LEDGERLM_LEASE_CHECK_INTERVAL_MS": "100",
    "LEDGERLM_USAGE_REPORT_TOKENS": "8",
    "LEDGERLM_USAGE_REPORT_MS": "200",
    "LEDGERLM_ADMISSION_TIMEOUT_MS": "20000",
    "LEDGERLM_WORKER_DEVICE": "cpu",
    "OMP_WAIT_POLICY": "PASSIVE",
}


@dataclass(frozen=True)
class ChaosConfig:
    home: Path  # the chaos stack's own home (wiped at start)
    model_dir: Path
    brokers: int = 3
    rate: float = 2.0  # clients started per second
    min_generations: int = 60
    output_tokens: int = 48
    gap_s: float = 6.0  # between faults
    broker_down_s: float = 20.0
    settle_s: float = 90.0
    client_deadline_s: float = 300.0
    instances: int = 1  # of each role
    faults: tuple[str, ...] | None = None  # None: every fault the instance count allows (fleet.py)
    role_down_s: float = 5.0  # how long a killed gateway or controller stays down (its replica serves)
    load_faults: LoadFaultTimes = LoadFaultTimes()  # how long a hog runs and a freeze lasts

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"instances must be at least 1, not {self.instances}")
        faults_for(self.instances, self.faults)  # ValueError naming a fault unknown or impossible here


def chaos_settings(config: ChaosConfig) -> Settings:
    base = Settings()
    return base.model_copy(update={
        "home": config.home, "kafka_jars": base.kafka_jars or base.home / "kafka-jars", "kafka_brokers": config.brokers,
        "kafka_heap": "512m", "kafka_bootstrap": None, "database_url": None, "kafka_port": None,
        "kafka_controller_port": None, "postgres_port": None, "topic_replication_factor": None})


async def run_chaos_bench(config: ChaosConfig) -> dict:
    began = time.monotonic()
    settings = chaos_settings(config)
    services = LocalServices(settings)
    await asyncio.to_thread(services.down)
    shutil.rmtree(config.home, ignore_errors=True)
    endpoints = await asyncio.to_thread(services.up)
    startup_s = round(time.monotonic() - began, 1)
    log.info("chaos stack up brokers=%d seconds=%.1f", config.brokers, startup_s)
    roles: dict[str, Role] = {}
    # The sink of the run's exporter, when its faults kill one (bench/chaos/export.py).
    receiver = export.MeterReceiver().start() if "exporter_kill9" in faults_for(config.instances,
                                                                                config.faults) else None
    try:
        return await _run(config, settings, services, endpoints.kafka_bootstrap, endpoints.database_url, roles,
                          {"brokers": config.brokers, "startup_s": startup_s, "began": began}, receiver)
    finally:
        await asyncio.to_thread(stop_all, list(roles.values()))
        await asyncio.to_thread(services.down)
        if receiver is not None:
            receiver.stop()


async def _run(config: ChaosConfig, settings: Settings, services: LocalServices, bootstrap: str, database_url: str,
               roles: dict[str, Role], cluster: dict, receiver: export.MeterReceiver | None) -> dict:
    setup = await prepare(config, settings, bootstrap, database_url)
    plane = f"chaos-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, **ROLE_ENV, "LEDGERLM_KAFKA_BOOTSTRAP": bootstrap, "LEDGERLM_DATABASE_URL": database_url,
           "LEDGERLM_HOME": str(config.home), "LEDGERLM_CONTROLLER_GROUP": plane,
           "LEDGERLM_GATEWAY_GROUP": f"{plane}-gateways"}
    fleet = build_fleet(config.instances, setup["model"], plane, env, config.home / "logs",
                        None if receiver is None else export.exporter_env(env, receiver, plane))
    roles.update(fleet.roles)
    from plumbing.kafka.groups import move_group_to_end

    await move_group_to_end(bootstrap, plane, "llm.commands")
    for role in roles.values():
        role.start()
    await wait_started(fleet)
    stop_supervising = asyncio.Event()
    supervisor = asyncio.create_task(supervise(roles, stop_supervising))
    tenants = [[httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=httpx.Timeout(30, read=60),
                                  headers={"Authorization": f"Bearer {key}"}) for port in fleet.gateway_ports]
               for key in setup["api_keys"]]
    try:
        for name, http in zip(fleet.named("gateway"), tenants[0]):
            await wait_admitting(http, setup["model"], roles[name])
        ready_s = round(time.monotonic() - cluster.pop("began"), 1)
        log.info("platform admitting seconds=%.1f instances=%d", ready_s, config.instances)
        target = faults.Plane(services, bootstrap, database_url, roles, fleet.new_worker)
        tally = Availability()
        results, fault_log, probe = await load_under_faults(config, tenants, setup["model"], setup["prompts"],
                                                            target, fleet, tally, receiver)
        report = await measure(config, settings, bootstrap, database_url, plane, setup, results, probe,
                               fault_log, receiver)
    finally:
        stop_supervising.set()
        await supervisor
        for http in (http for clients in tenants for http in clients):
            await http.aclose()
    availability = tally.report(fault_log.faults, fault_log.began)
    # Generations the worker kill cut short end `interrupted`, as designed: counted apart, never as errors.
    killed = {fault["killed"] for fault in fault_log.faults if fault["fault"] == "worker_kill9"}
    on_worker = report["reports"]["interrupted_on_worker"]
    availability["interrupted_by_worker_kill"] = sum(n for worker, n in on_worker.items() if worker in killed)
    availability["interrupted_otherwise"] = sum(n for worker, n in on_worker.items() if worker not in killed)
    report.update({"interrupted_alive": availability["interrupted_otherwise"],
                   "availability_error_fraction": availability["availability_error_fraction"],
                   "availability": availability, "instances": config.instances,
                   "faults": len(fault_log.faults), "fault_log": fault_log.faults,
                   "role_restarts": {name: role.crash_restarts for name, role in roles.items()},
                   "cluster": {**cluster, "ready_s": ready_s}, "topics": setup["topics"]})
    return report


async def prepare(config: ChaosConfig, settings: Settings, bootstrap: str, database_url: str) -> dict:
    """Migrate, create topics (RF from the cluster), register the model, create two tenants."""
    from bench.admission import workload
    from migrations import runner
    from plumbing.kafka.topic_admin import TopicAdmin
    from producers.model_registry import describe, register_model
    from producers.tenant_admin import create_tenant
    from schemas.values import TenantLimits

    await asyncio.to_thread(runner.upgrade, database_url)
    async with TopicAdmin(bootstrap, settings.topic_partitions, None) as admin:
        declared = await admin.ensure()
        await admin.ensure((PROBE_SPEC,))
        replication = admin.replication_factor
        min_isr = {name: c.get("min.insync.replicas") for name, c in (await admin._configs(
            [s for s in declared.created])).items()}
    model = f"chaos-{describe(config.model_dir, 'probe').content_sha256[:8]}@1"
    await register_model(bootstrap, config.model_dir, model)
    limits = TenantLimits(max_tokens_in_flight=10_000_000, tokens_per_minute=100_000_000, max_concurrency=10_000)
    tenants = [await create_tenant(bootstrap, database_url, f"chaos-{name}-{uuid.uuid4().hex[:6]}", limits)
               for name in ("a", "b")]
    return {"model": model, "api_keys": [t.api_key for t in tenants], "tenant_ids": {t.tenant_id for t in tenants},
            "prompts": workload(32), "topics": {"replication_factor": replication, "drift": len(declared.drift),
                                                "min_insync_replicas": min_isr}}


async def wait_admitting(http: httpx.AsyncClient, model: str, gateway: Role, timeout_s: float = 120) -> None:
    """Until one generation is admitted: the gateway listens and the worker's heartbeat reached the controller."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            response = await http.post("/v1/generations?wait=true", json={
                "requestId": uuid.uuid4().hex, "model": model, "input": "warm up", "maxOutputTokens": 2})
            if response.status_code in (200, 201):
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"nothing admitted within {timeout_s:.0f}s; gateway log tail:\n"
                       f"{gateway.log.read_text(errors='replace')[-2000:]}")


async def load_under_faults(config: ChaosConfig, tenants: list[list[httpx.AsyncClient]], model: str,
                            prompts: list[str], target: faults.Plane, fleet: Fleet, tally: Availability,
                            receiver: export.MeterReceiver | None = None
                            ) -> tuple[list[ClientResult], faults.FaultLog, faults.Probe]:
    load = SteadyLoad(tenants, model, prompts, config.output_tokens, config.rate, config.client_deadline_s, tally)
    probe, probe_stop = faults.Probe(target.bootstrap), asyncio.Event()
    fault_log = faults.FaultLog()
    steps = fault_steps(faults_for(config.instances, config.faults), fleet, target, fault_log,
                        load.ended_generation_ids, config.broker_down_s, config.role_down_s,
                        config.load_faults, receiver)
    running = asyncio.create_task(load.run(config.min_generations))
    probing = asyncio.create_task(probe.run(probe_stop))
    try:
        for number, step in enumerate(steps, start=1):
            await asyncio.sleep(config.gap_s)
            log.info("fault %d/%d starting clients=%d", number, len(steps), len(load.clients))
            await step()
        await asyncio.sleep(config.gap_s)  # some generations through the healed platform
    finally:
        load.keep_going.clear()
        probe_stop.set()
        await probing
    return await running, fault_log, probe


async def measure(config: ChaosConfig, settings: Settings, bootstrap: str, database_url: str, plane: str, setup: dict,
                  results: list[ClientResult], probe: faults.Probe, fault_log: faults.FaultLog,
                  receiver: export.MeterReceiver | None = None) -> dict:
    from projections.audit import audit_replay

    log.info("load over generations=%d; checking", len(results))
    stuck = await checks.find_stuck(database_url, results, config.settle_s)
    unreleased = await checks.wait_released(bootstrap, plane, setup["tenant_ids"], config.settle_s)
    events = await checks.generation_events(bootstrap)
    streamed = checks.streamed_on_log(checks.decoded(TOKENS, await checks.read_log(bootstrap, TOKENS)))
    overbilled = await asyncio.to_thread(checks.find_overbilled, database_url, results, events, streamed)
    lost = checks.find_lost(probe.acked, await checks.read_log(bootstrap, faults.PROBE_TOPIC), results, events)
    audit = await audit_replay(bootstrap, database_url, settings.model_copy(update={
        "kafka_bootstrap": bootstrap, "database_url": database_url}))
    exported = None if receiver is None else await export.check_export(bootstrap, database_url, receiver,
                                                                       config.settle_s)
    export_found = {} if exported is None else {f"export_{kind}": found for kind, found in
                                                exported["found"].items()}
    ours = {r.generation_id for r in results if r.generation_id}
    run_events = [e for e in events if e.generation_id in ours]
    violations = place({
        "stuck": stuck, "overbilled": overbilled, "duplicate_seqs": checks.find_seq_faults(results, "duplicate"),
        "missing_seqs": checks.find_seq_faults(results, "missing"), "unreleased_reservations": unreleased,
        "lost_events": lost,
        "audit_differences": [{"table": name, **diff} for name, diff in audit.as_dict()["tables"].items()],
        **export_found,
    }, results, fault_log.faults, fault_log.began)
    for kind, found in violations.items():
        for violation in found:
            # Its terms too (statuses, seqs, counts, the client's error classes): a test's assertion message is cut
            # short, and this line is what a failed run leaves to diagnose. Not an audit difference's: its sample
            # rows may hold output text.
            terms = {} if kind == "audit_differences" else {
                key: value for key, value in violation.items() if key not in ("generation_id", "nearest_fault")}
            log.warning("violation kind=%s generation=%s nearest_fault=%s terms=%s", kind,
                        violation.get("generation_id"), (violation.get("nearest_fault") or {}).get("fault"),
                        json.dumps(terms, default=str)[:2000])
    return {
        "stuck": len(stuck), "audit_differences": audit.differences, "overbilled": len(overbilled),
        "duplicate_seqs": sum(r.duplicate_seqs for r in results),
        "missing_seqs": sum(r.missing_seqs for r in results),
        "unreleased_reservations": len(unreleased), "lost_events": len(lost),
        **{key: len(export_found.get(key, ())) for key in export.COUNTS},
        "export": None if exported is None else {k: v for k, v in exported.items() if k != "found"},
        "violations": {kind: found for kind, found in violations.items() if found},
        "generations": summarize_clients(results),
        "reports": {"usage_reports_on_log": sum(1 for e in run_events if e.type == "UsageReported"),
                    "terminal_events_on_log": sum(1 for e in run_events if e.type in checks.TERMINAL_TYPES),
                    "interrupted_on_worker": dict(Counter(e.worker_id for e in run_events if e.type == "Interrupted")),
                    "interrupted_reasons": dict(Counter(e.reason for e in run_events if e.type == "Interrupted")),
                    "audit_replayed": audit.replayed, "audit_tables_differing": sorted(audit.as_dict()["tables"])},
        "probe": {"acked": len(probe.acked), "not_acked": probe.failed},
    }


def summarize_clients(results: list[ClientResult]) -> dict:
    return {"started": len(results), "admitted": sum(1 for r in results if r.generation_id),
            "by_end": dict(Counter(r.final["reason"] for r in results if r.final)),
            "tokens_received": sum(r.tokens for r in results), "resumes": sum(r.resumes for r in results),
            "client_errors": dict(Counter(e for r in results for e in r.errors))}
