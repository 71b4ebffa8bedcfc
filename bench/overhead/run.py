"""`ledgerlm bench overhead`: where each CPU millisecond of the platform goes, per request and per output token.

    prepare   prompts of each mix (tokenized here, before anything is measured)
    stack     controller, worker, projector, gateway processes (bench/overhead/stack.py) on the running
              broker and database; one warm-up request per mix; projector caught up; Postgres counters settled
    idle      `idle_s` with no traffic and nothing polled: CPU per role -> idle cores
    each mix  `clients` closed-loop streamed chats for `duration_s`, then until the projector has applied
              everything: CPU per role (/proc), Kafka records and bytes per topic, Postgres rows per table
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.overhead import report
from bench.overhead.kafka import broker_log_dirs, snapshot, topic_deltas
from bench.overhead.load import MIXES, LoadResult, Mix, PromptMaker, closed_loop, fitted, one_chat
from bench.overhead.postgres import RowSnapshot, row_deltas, settled_rows, wait_projected
from bench.overhead.stack import Stack, platform
from bench.proc_cpu import CpuSampler, PROC, cpu_seconds, process_ticks, read_stat, thread_ticks, tree_ticks
from plumbing.settings import Settings


@dataclass(frozen=True)
class OverheadConfig:
    clients: int = 16
    duration_s: float = 60.0
    idle_s: float = 30.0
    mixes: tuple[str, ...] = ("default", "shorter", "longer")
    prompt_pool: int = 2048


QUICK = OverheadConfig(duration_s=15.0, idle_s=10.0, mixes=("default",), prompt_pool=512)


@dataclass(frozen=True)
class ServedModel:
    version: str
    model_dir: Path
    max_context: int


def service_pids(settings: Settings) -> tuple[list[int], int | None]:
    """(broker pids, postmaster pid) of the local services; empty / None where a service is external."""
    from infra.postgres_node import PostgresNode
    from infra.state import ServicesState

    state = ServicesState.load(settings.state_file)
    brokers = [] if settings.kafka_bootstrap else [b.pid for b in state.kafka_brokers if b.pid] or (
        [state.kafka.pid] if state.kafka.pid else [])
    postmaster = None if settings.database_url else PostgresNode(settings.home, settings.postgres_database).server_pid()
    return [pid for pid in brokers if (PROC / str(pid)).exists()], postmaster


def sampler_for(pids: dict[str, int], brokers: list[int], postmaster: int | None) -> CpuSampler:
    """CPU probes of the platform's roles (`pids`: role -> process id), the brokers, PostgreSQL and this process."""
    me = os.getpid()

    def kafka() -> int | None:
        ticks = [process_ticks(pid) for pid in brokers]
        return None if not ticks or None in ticks else sum(ticks)

    def own() -> int | None:
        stat = read_stat(PROC / str(me) / "stat")
        return stat.own_ticks if stat else None

    probes = {role: (lambda pid=pids[role]: process_ticks(pid)) for role in ("gateway", "controller", "projector")}
    probes |= {"worker": lambda: process_ticks(pids["worker"]),
               "worker_engine": lambda: thread_ticks(pids["worker"], "engine"),
               "kafka": kafka,
               "postgres": lambda: None if postmaster is None else tree_ticks(postmaster),
               "load_generator": own}
    return CpuSampler(probes)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def warm_up(stack: Stack, prompts: dict[str, list[tuple[str, int]]], mixes: dict[str, Mix],
                  timeout_s: float = 120) -> None:
    """One whole request per mix (tokenizers, kernels, connections); until the worker's first heartbeat
    reached the controller the gateway answers 503, so each is retried until it completes."""
    import httpx

    async with httpx.AsyncClient(base_url=stack.base_url, headers={"Authorization": f"Bearer {stack.api_key}"},
                                 timeout=120) as http:
        for name, mix in mixes.items():
            deadline, result = time.monotonic() + timeout_s, LoadResult()
            while not result.completed:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"warm-up of mix {name} never completed: {dict(result.errors)}")
                await one_chat(http, stack.model, prompts[name][0][0], mix.output_tokens, result)


async def idle_phase(sampler: CpuSampler, seconds: float) -> dict:
    before, started = sampler.sample(), time.monotonic()
    await asyncio.sleep(seconds)  # the measurement itself: a fixed window of no traffic
    cpu, elapsed = report.split_worker(cpu_seconds(before, sampler.sample())), time.monotonic() - started
    cores = report.idle_cores(cpu, elapsed)
    total = sum(cores.get(role) or 0.0 for role in report.PLATFORM_ROLES)
    return {"seconds": round(elapsed, 2), "cores_by_role": cores, "cores": round(total, 4),
            "missing_roles": report.missing_roles(cpu)}


async def mix_phase(stack: Stack, sampler: CpuSampler, mix: Mix, prompts: list[tuple[str, int]],
                    config: OverheadConfig, log_dirs: list[Path], rows_before: RowSnapshot,
                    idle: dict) -> tuple[dict, RowSnapshot]:
    kafka_before = await snapshot(stack.bootstrap, log_dirs)
    load_start, cpu_before, started = load_average(), sampler.sample(), time.monotonic()
    load = await closed_loop(stack.base_url, stack.api_key, stack.model, prompts, mix.output_tokens,
                             config.clients, config.duration_s)
    load_s = time.monotonic() - started
    drain_s = await wait_projected(stack.database_url, stack.bootstrap)
    cpu_after, wall_s, load_end = sampler.sample(), time.monotonic() - started, load_average()
    kafka_after = await snapshot(stack.bootstrap, log_dirs)
    rows_after = await settled_rows(stack.database_url)
    cpu = report.split_worker(cpu_seconds(cpu_before, cpu_after))
    requests, tokens = load.completed, load.output_tokens
    costs = report.costs(cpu, idle["cores_by_role"], requests, tokens, wall_s)
    topics = report.per_unit(topic_deltas(kafka_before, kafka_after), requests, tokens)
    tables = report.per_unit(row_deltas(rows_before.tables, rows_after.tables), requests, tokens, ["written"])
    wal_bytes = rows_after.wal_lsn_bytes - rows_before.wal_lsn_bytes
    per_request_tokens = tokens / requests if requests else 0.0
    target = report.target_ms_per_request(per_request_tokens)
    result = {
        "mix": asdict(mix), "requests": requests, "output_tokens": tokens, **load.summary(),
        "wall_s": round(wall_s, 2), "load_s": round(load_s, 2), "drain_s": drain_s,
        "requests_per_s": round(requests / wall_s, 2), "output_tokens_per_s": round(tokens / wall_s, 1),
        "platform": costs["platform"], "roles": costs["roles"], "top_platform_roles": report.top_roles(costs["roles"]),
        "kafka": {"topics": topics,
                  "records_per_request": report.ratio(report.summed(topics, "records"), requests, 1.0),
                  "bytes_per_request": report.ratio(report.summed(topics, "bytes"), requests, 1.0, 1),
                  "bytes_per_output_token": report.ratio(report.summed(topics, "bytes"), tokens, 1.0, 1)},
        "postgres": {"tables": tables,
                     "rows_written_per_request": report.ratio(report.summed(tables, "written"), requests, 1.0),
                     "wal_bytes_per_request": report.ratio(wal_bytes, requests, 1.0, 1),
                     "settle_s": rows_after.settle_s},
        "load_average": {"start": load_start, "end": load_end},
        "target_ms_per_request": target,
        "target_met": costs["platform"]["ms_per_request"] is not None and not costs["platform"]["missing_roles"]
        and costs["platform"]["ms_per_request"] <= target}
    return result, rows_after


async def run_overhead_bench(model: ServedModel, config: OverheadConfig, workdir: Path) -> dict:
    settings, began = Settings(), time.monotonic()
    brokers, postmaster = service_pids(settings)
    log_dirs = broker_log_dirs(brokers)
    mixes, notes = {}, {}
    for name in config.mixes:
        mixes[name], note = fitted(MIXES[name], model.max_context)
        if note:
            notes[name] = note
    maker = PromptMaker(model.model_dir)
    prompts = {name: maker.pool(mix.prompt_tokens, config.prompt_pool) for name, mix in mixes.items()}
    load_at_start = load_average()
    async with platform(model.version, workdir) as stack:
        sampler = sampler_for(stack.pids, brokers, postmaster)
        await warm_up(stack, prompts, mixes)
        await wait_projected(stack.database_url, stack.bootstrap)
        rows = await settled_rows(stack.database_url)
        idle = await idle_phase(sampler, config.idle_s)
        results = {}
        for name, mix in mixes.items():
            results[name], rows = await mix_phase(stack, sampler, mix, prompts[name], config, log_dirs, rows, idle)
    return assemble(model, config, results, idle, notes, load_at_start, time.monotonic() - began)


def assemble(model: ServedModel, config: OverheadConfig, results: dict[str, dict], idle: dict,
             notes: dict[str, str], load_at_start: list[float], wall_s: float) -> dict:
    first = results.get("default") or next(iter(results.values()))
    points = [(r["output_tokens"] / r["requests"], r["platform"]["ms_per_request"]) for r in results.values()
              if r["requests"] and r["platform"]["ms_per_request"] is not None]
    targets = {"platform_fixed_ms": report.TARGET_FIXED_MS,
               "platform_us_per_output_token": report.TARGET_US_PER_OUTPUT_TOKEN,
               "idle_cores": report.TARGET_IDLE_CORES}
    met = {f"platform_ms_per_request_{name}": r["target_met"] for name, r in results.items()}
    met["idle_cores"] = not idle["missing_roles"] and idle["cores"] <= report.TARGET_IDLE_CORES
    return {
        "platform_cpu_ms_per_request": first["platform"]["ms_per_request"],
        "platform_cpu_us_per_output_token": first["platform"]["us_per_output_token"],
        "idle_cores": idle["cores"], "idle_cores_by_role": idle["cores_by_role"],
        "top_platform_roles": first["top_platform_roles"],
        "fit": report.linear_fit(points), "targets": targets, "targets_met": met,
        "all_targets_met": all(met.values()),
        "model": {"version": model.version, "model_dir": str(model.model_dir), "max_context": model.max_context},
        "config": asdict(config), "mix_notes": notes, "idle": idle, "mixes": results,
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": load_at_start,
                    "load_average_at_end": load_average(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")},
        "wall_s": round(wall_s, 1), "definitions": report.DEFINITIONS}
