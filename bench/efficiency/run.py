"""`ledgerlm bench efficiency`: what the platform costs beside its own engine, per output token and per second.

    platform  controller, worker, projector, gateway with DEFAULT settings (only the worker's device and metrics
              port are set) on the running broker and database, the real model
    idle      `idle_s` of no traffic: cores per role (before the load)
    levels    N closed-loop streamed chats (mix a: 128-token prompts, 64 output tokens, ignore_eos) for
              `duration_s`, the streams still open then run to their end; CPU per role from /proc over the level
    idle      again, after the load
    engine    the platform stopped, the worker's engine alone in this process on the same prompt token ids,
              the same levels and durations

Per level: tok/s of both and their ratio, TTFT and ITL p50/p95 of both, CPU per role as cores and as ms per
output token (idle subtracted), and everything outside the engine thread per output token. Streams last
seconds with the real model, so a cost that grows with the time a stream is open shows here; the tiny demo
model (`--model-dir` of a demo model) hides it.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.capacity.client import MIXES, closed_loop
from bench.capacity.metrics import client_summary
from bench.capacity.run import CapacityConfig, Prompts, default_tenant, platform_settings, run_engine, warm
from bench.common import free_port
from bench.efficiency.engine_timing import sample_timing, stall_share
from bench.efficiency.kafka_rates import KafkaRequestScraper, request_rates
from bench.overhead.run import load_average, sampler_for, service_pids
from bench.proc_cpu import CpuSampler, cpu_seconds
from bench.serve.targets import ledgerlm_platform
from plumbing.settings import Settings

MIX = "a"
# Everything the platform runs beside the engine thread: what "outside the engine" sums.
OUTSIDE_ENGINE = ("gateway", "controller", "projector", "worker_other", "kafka", "postgres")
TARGETS = {"tok_s_ratio_min": 0.9, "itl_p95_ratio_max": 1.15, "outside_engine_ms_per_token_at_1": 2.0,
           "outside_engine_ms_per_token_at_8": 1.0, "idle_cores_max": 0.05}


@dataclass(frozen=True)
class EfficiencyConfig:
    levels: tuple[int, ...] = (1, 4, 8, 16)
    duration_s: float = 45.0
    drain_s: float = 60.0
    idle_s: float = 20.0
    prompt_tokens: int = 128
    prompts_per_level: int = 256


QUICK = EfficiencyConfig(levels=(1, 4), duration_s=15.0, drain_s=30.0, idle_s=5.0, prompts_per_level=64)


def with_worker_split(cpu: dict[str, float | None]) -> dict[str, float | None]:
    worker, engine = cpu.get("worker"), cpu.get("worker_engine")
    return {**cpu, "worker_other": None if worker is None or engine is None else max(worker - engine, 0.0)}


async def idle_phase(sampler: CpuSampler, scraper: KafkaRequestScraper, seconds: float) -> dict:
    import asyncio

    requests, before, began = await scraper.sample(), sampler.sample(), time.monotonic()
    await asyncio.sleep(seconds)  # the measurement itself: a fixed window with no traffic
    elapsed = time.monotonic() - began
    cpu = with_worker_split(cpu_seconds(before, sampler.sample()))
    rates = request_rates(requests, await scraper.sample(), elapsed)
    cores = {role: None if s is None else round(s / elapsed, 4) for role, s in cpu.items()}
    stack = [cores[r] for r in ("worker", "gateway", "controller", "projector", "kafka", "postgres")]
    return {"seconds": round(elapsed, 2), "cores_by_role": cores,
            "cores": None if None in stack else round(sum(stack), 4), "kafka_requests_per_s": rates,
            "load_average": load_average()}


def role_metrics_urls(platform, settings: dict[str, str]) -> dict[str, str]:
    local = "http://127.0.0.1:{}/metrics".format
    return {"gateway": f"{platform.target.base_url}/metrics",
            "controller": local(settings["LEDGERLM_CONTROLLER_METRICS_PORT"]),
            "worker": local(settings["LEDGERLM_WORKER_METRICS_PORT"]),
            "projector": local(settings["LEDGERLM_PROJECTOR_METRICS_PORT"])}


def role_costs(cpu: dict[str, float | None], idle: dict[str, float | None], wall_s: float, tokens: int) -> dict:
    """Per role: cores over the level, and ms of CPU per output token with the idle burn subtracted."""
    out = {}
    for role, seconds in cpu.items():
        if seconds is None:
            out[role] = {"cpu_s": None, "cores": None, "ms_per_output_token": None}
            continue
        busy = max(seconds - (idle.get(role) or 0.0) * wall_s, 0.0)
        out[role] = {"cpu_s": round(seconds, 2), "cores": round(seconds / wall_s, 3),
                     "ms_per_output_token": round(busy * 1000 / tokens, 3) if tokens else None}
    return out


def outside_engine(costs: dict) -> float | None:
    parts = [costs.get(role, {}).get("ms_per_output_token") for role in OUTSIDE_ENGINE]
    return None if None in parts else round(sum(parts), 3)


async def platform_levels(model_dir: Path, prompts: Prompts, config: EfficiencyConfig, workdir: Path) -> dict:
    brokers, postmaster = service_pids(Settings())
    # Metrics ports only, so each role's Kafka request counts can be read: no setting that changes behaviour.
    settings = {**platform_settings(free_port()), "LEDGERLM_CONTROLLER_METRICS_PORT": str(free_port()),
                "LEDGERLM_PROJECTOR_METRICS_PORT": str(free_port())}
    async with ledgerlm_platform(model_dir, [default_tenant()], workdir, settings=settings,
                                 bench="efficiency") as platform:
        sampler = sampler_for(platform.pids, brokers, postmaster)
        scraper = KafkaRequestScraper(role_metrics_urls(platform, settings))
        await warm(platform.target, prompts(MIX, 0))
        idle_before = await idle_phase(sampler, scraper, config.idle_s)
        levels, worker_url = [], role_metrics_urls(platform, settings)["worker"]
        for concurrency in config.levels:
            timing = await sample_timing(worker_url)
            load, requests, before, began = load_average(), await scraper.sample(), sampler.sample(), time.monotonic()
            _, records = await closed_loop(platform.target, prompts(MIX, concurrency), MIXES[MIX], concurrency,
                                           config.duration_s, config.drain_s)
            wall_s = time.monotonic() - began
            cpu = with_worker_split(cpu_seconds(before, sampler.sample()))
            rates = request_rates(requests, await scraper.sample(), wall_s)
            levels.append({"concurrency": concurrency, "load_avg_at_start": load, "load_avg_at_end": load_average(),
                           "wall_s": round(wall_s, 2), "output_tokens": sum(r.output_tokens for r in records),
                           **client_summary(records, config.duration_s), "cpu_s": cpu,
                           "kafka_requests_per_s": rates,
                           "engine_thread": stall_share(timing, await sample_timing(worker_url))})
        idle_after = await idle_phase(sampler, scraper, config.idle_s)
    # The lower idle burn of the two is what is subtracted: the broker's JIT can still be warming up before the
    # load, and an inflated idle would hide what the load cost.
    idle = {role: min((v for v in (idle_before["cores_by_role"].get(role), idle_after["cores_by_role"].get(role))
                       if v is not None), default=None) for role in idle_after["cores_by_role"]}
    for level in levels:
        level["roles"] = role_costs(level.pop("cpu_s"), idle, level["wall_s"], level["output_tokens"])
        level["outside_engine_ms_per_output_token"] = outside_engine(level["roles"])
    return {"idle_before": idle_before, "idle_after": idle_after, "idle_subtracted_cores": idle, "levels": levels}


def compare(platform: list[dict], engine: list[dict]) -> list[dict]:
    """Per level: the platform's tok/s over the engine's, and their p95 ITL and TTFT side by side."""
    alone = {level["concurrency"]: level for level in engine}
    rows = []
    for level in platform:
        other = alone.get(level["concurrency"], {})
        ours, theirs = level.get("output_tok_s"), other.get("output_tok_s")
        itl, itl_alone = level["itl_ms"].get("p95"), other.get("itl_ms", {}).get("p95")
        rows.append({"concurrency": level["concurrency"], "platform_tok_s": ours, "engine_tok_s": theirs,
                     "tok_s_ratio": round(ours / theirs, 3) if ours and theirs else None,
                     "platform_itl_ms": level["itl_ms"], "engine_itl_ms": other.get("itl_ms"),
                     "itl_p95_ratio": round(itl / itl_alone, 3) if itl and itl_alone else None,
                     "platform_ttft_ms": level["ttft_ms"], "engine_ttft_ms": other.get("ttft_ms"),
                     "errors": {k: level[k] for k in ("refused_429", "refused_503", "other")},
                     "kafka_requests_per_s": level.get("kafka_requests_per_s"),
                     "outside_engine_ms_per_output_token": level["outside_engine_ms_per_output_token"],
                     "engine_stalled_share": (level.get("engine_thread") or {}).get("stalled_share")})
    return rows


def check(rows: list[dict], idle_before: dict, idle_after: dict) -> dict[str, bool | None]:
    by = {row["concurrency"]: row for row in rows}

    def at(c: int, key: str):
        return by.get(c, {}).get(key)

    met: dict[str, bool | None] = {}
    for c in (1, 4, 8):
        ratio = at(c, "tok_s_ratio")
        met[f"tok_s_ratio_at_{c}"] = None if ratio is None else ratio >= TARGETS["tok_s_ratio_min"]
    for c in (1, 8):
        ratio = at(c, "itl_p95_ratio")
        met[f"itl_p95_ratio_at_{c}"] = None if ratio is None else ratio <= TARGETS["itl_p95_ratio_max"]
        cost = at(c, "outside_engine_ms_per_output_token")
        met[f"outside_engine_ms_per_token_at_{c}"] = None if cost is None else \
            cost <= TARGETS[f"outside_engine_ms_per_token_at_{c}"]
    for name, idle in (("idle_cores_before", idle_before), ("idle_cores_after", idle_after)):
        met[name] = None if idle["cores"] is None else idle["cores"] <= TARGETS["idle_cores_max"]
    return met


async def run_efficiency_bench(model_dir: Path, config: EfficiencyConfig, workdir: Path) -> dict:
    began, load_start = time.monotonic(), load_average()
    capacity = CapacityConfig(levels=config.levels, duration_s=config.duration_s, drain_s=config.drain_s,
                              mixes=(MIX,), servers=("ledgerlm", "engine"), prompt_tokens=config.prompt_tokens,
                              prompts_per_level=config.prompts_per_level)
    prompts = Prompts(model_dir, capacity)
    platform = await platform_levels(model_dir, prompts, config, workdir)
    engine_began = time.monotonic()
    engine = run_engine(model_dir, prompts, capacity, {MIX: list(config.levels)})[MIX]["levels"]
    rows = compare(platform["levels"], engine)
    met = check(rows, platform["idle_before"], platform["idle_after"])
    return {"comparison": rows, "targets": TARGETS, "targets_met": met,
            "idle_cores_before": platform["idle_before"]["cores"], "idle_cores_after": platform["idle_after"]["cores"],
            "platform": platform,
            "engine_alone": {"levels": engine, "wall_s": round(time.monotonic() - engine_began, 1)},
            "not_measured": ["Kafka requests of the broker itself (replication, its controller) and the "
                             "clients' metadata refreshes; the per-role rates count the rest"],
            "model_dir": str(model_dir), "config": asdict(config),
            "machine": {"cpus": os.cpu_count(), "load_average_at_start": load_start,
                        "load_average_at_end": load_average()},
            "wall_s": round(time.monotonic() - began, 1)}
