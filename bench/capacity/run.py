"""`ledgerlm bench capacity`: closed-loop streamed chat at rising concurrency, as an OpenAI benchmark client sends.

    mix a   128-token prompt, max_tokens 64, ignore_eos: every answer is 64 tokens
    mix b   128-token prompt with a short question, no max_tokens: answers end at EOS

    servers ledgerlm            a fresh control plane with DEFAULT settings (only endpoints, ports and the
                                worker's device are set), one tenant with the default limits
            transformers_serve  `transformers serve --continuous-batching` on the same model and cores
            engine              the worker's engine in this process (no Kafka, no HTTP), same prompts

Each level: a settle probe (what the previous level left running must end first), the load average, then N
clients for duration_s, then up to drain_s for the streams still open. The servers run one after the other
(ledgerlm, transformers serve, the engine alone), each level of one mix then the next mix.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench.capacity.client import MIXES, Mix, closed_loop
from bench.capacity.metrics import DEFINITIONS, client_summary, ratios, saturation, working_set
from bench.capacity.prompts import ChatPrompt, chat_prompts, render_ids
from bench.capacity.refusals import refusal_terms
from bench.capacity.targets import TARGETS, check_targets
from bench.capacity.worker import WorkerScraper, heartbeat_summary, scrape_summary
from bench.common import free_port
from bench.serve.client import Target
from bench.serve.targets import (PER_STEP_TOKENS, Platform, TargetUnavailable, TenantSpec, ledgerlm_platform,
                                 transformers_serve, worker_kv_blocks)
from plumbing.settings import Settings

SERVERS = ("ledgerlm", "transformers_serve", "engine")
# transformers serve on CPU would otherwise size its KV cache at 90% of the machine's memory: 512 MiB holds the
# top level's working set (32 x ~200 tokens) many times over without crowding a shared machine.
TRANSFORMERS_KV_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class CapacityConfig:
    levels: tuple[int, ...]
    duration_s: float
    drain_s: float  # how long streams still open at the window's end may run on
    mixes: tuple[str, ...]
    servers: tuple[str, ...] = SERVERS
    engine_levels: str = "saturation"  # "saturation": at ledgerlm's saturation only; "all": every level
    prompt_tokens: int = 128
    prompts_per_level: int = 256
    settle_limit_s: float = 30.0
    seed: int = 0
    quick: bool = False
    client: str = "builtin"  # "guidellm": guidellm itself drives ledgerlm's levels (bench/capacity/guidellm.py)


FULL = CapacityConfig(levels=(1, 2, 4, 8, 16, 32), duration_s=60, drain_s=60, mixes=("a", "b"))
# About 3.5 minutes on a loaded 2-core machine: two server start-ups (~40 s and ~10 s) and 3 short levels each.
QUICK = CapacityConfig(levels=(1, 4, 16), duration_s=15, drain_s=15, mixes=("a",), settle_limit_s=10.0, quick=True)


def default_tenant() -> TenantSpec:
    """The tenant `tenants create` would make: TenantLimits' defaults."""
    from schemas.values import TenantLimits

    limits = TenantLimits()
    return TenantSpec("chat", limits.weight, limits.max_concurrency, limits.tokens_per_minute,
                      limits.max_tokens_in_flight)


class Prompts:
    """The same prompts for every server at one (mix, level): seeded by both, made once. `lengths` sets the
    rendered length per level (default: the config's `prompt_tokens` at every level)."""

    def __init__(self, model_dir: Path, config: CapacityConfig, lengths: dict[int, int] | None = None) -> None:
        from transformers import AutoTokenizer

        self.model_dir = model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.config = config
        self.lengths = lengths or {}
        self.made: dict[tuple[str, int], list[ChatPrompt]] = {}

    def __call__(self, mix: str, concurrency: int) -> list[ChatPrompt]:
        key = (mix, concurrency)
        if key not in self.made:
            self.made[key] = chat_prompts(self.tokenizer, mix, self.config.prompts_per_level,
                                          self.config.seed * 1000 + concurrency,
                                          self.lengths.get(concurrency, self.config.prompt_tokens))
        return self.made[key]

    def as_long_as(self, levels: list[dict]) -> "Prompts":
        """Prompts for the engine alone as long as guidellm's requests were on the platform, level by level."""
        return Prompts(self.model_dir, self.config, rendered_lengths(levels))

    def replaying(self, levels: list[dict]) -> "Prompts":
        """The engine alone's prompts for guidellm's levels: the prompts guidellm sent at each level, in order,
        rendered with the model's chat template (where a level's report is gone: as long as they were)."""
        from bench.capacity.guidellm import sent_prompts

        shaped = self.as_long_as(levels)
        for level in levels:
            report = Path(level.get("report") or "")
            sent = sent_prompts(json.loads(report.read_text())) if report.is_file() else []
            if sent:
                shaped.made[("a", level["concurrency"])] = [
                    ChatPrompt(messages, tuple(render_ids(self.tokenizer, list(messages)))) for messages in sent]
        return shaped


def rendered_lengths(levels: list[dict]) -> dict[int, int]:
    """Per guidellm level, the mean prompt its requests rendered to on the platform: its 128 tokens of text with
    the chat template (and the tokens guidellm puts before the text) come to about 158, where the bench's own
    prompts are 128 in all. A level without the number keeps the default."""
    return {lv["concurrency"]: round(lv["prompt_tokens_per_request"]["mean"]) for lv in levels
            if (lv.get("prompt_tokens_per_request") or {}).get("mean")}


# guidellm's requests name no temperature, so the platform samples them at OpenAI's default, 1.0: the engine
# alone samples its guidellm-shaped requests the same way (the bench's own clients ask for greedy).
GUIDELLM_MIXES = {"a": replace(MIXES["a"], temperature=1.0)}


async def run_level(target: Target, prompts: list[ChatPrompt], mix: Mix, concurrency: int, config: CapacityConfig,
                    observe=None) -> dict:
    from bench.serve.run import settle

    settled_s = await settle(target, limit_s=config.settle_limit_s)
    load = [round(x, 2) for x in os.getloadavg()]
    t0, records = await closed_loop(target, prompts, mix, concurrency, config.duration_s, config.drain_s)
    level = {"concurrency": concurrency, "settled_s": settled_s, "load_avg_at_start": load,
             **client_summary(records, config.duration_s)}
    if observe is not None:
        level.update(observe(t0, t0 + config.duration_s))
    return level


async def warm(target: Target, prompts: list[ChatPrompt]) -> None:
    """Short chats from two clients for 3 s (tokenizers, chat template, first-touch allocations): not measured."""
    _, records = await closed_loop(target, prompts, Mix("warm", 4, True), 2, 3.0, 120)
    if not any(r.completed for r in records):
        raise TargetUnavailable(f"{target.name}: warm-up got no answer: {[r.error or r.status for r in records]}")


async def sweep(target: Target, prompts: Prompts, config: CapacityConfig, observe=None) -> dict[str, dict]:
    await warm(target, prompts(config.mixes[0], 0))
    runs = {}
    for mix in config.mixes:
        levels = [await run_level(target, prompts(mix, c), MIXES[mix], c, config, observe) for c in config.levels]
        runs[mix] = {"levels": levels, "saturation": saturation(levels)}
    return runs


async def guidellm_sweep(target: Target, prompts: Prompts, model_dir: Path, config: CapacityConfig, workdir: Path,
                         observe) -> dict[str, dict]:
    """The levels driven by guidellm (its synthetic 128-token prompts, 64 output tokens: mix a's shape)."""
    from bench.capacity import guidellm
    from bench.serve.run import settle

    await warm(target, prompts("a", 0))
    levels = []
    for concurrency in config.levels:
        settled_s = await settle(target, limit_s=config.settle_limit_s)
        load = [round(x, 2) for x in os.getloadavg()]
        t0, wall0 = time.monotonic(), time.time()
        level = await guidellm.run_level(target, default_tenant().name, model_dir, concurrency, config.duration_s,
                                         workdir)
        levels.append({**level, "settled_s": settled_s, "load_avg_at_start": load,
                       "refusals": refusal_terms(workdir / "controller.log", wall0, time.time()),
                       **observe(t0, time.monotonic())})
    return {"a": {"levels": levels, "saturation": saturation(levels)}}


def platform_observer(platform: Platform, scraper: WorkerScraper):
    def observe(t0: float, t1: float) -> dict:
        beats = [s for s in platform.heartbeats.samples if t0 <= s["t"] <= t1]
        return {**scrape_summary(scraper.samples, t0, t1), **heartbeat_summary(beats)}
    return observe


def platform_settings(metrics_port: int) -> dict[str, str]:
    """All the harness sets: no KV pool, reservation, queue or heartbeat setting, so the defaults are measured."""
    return {"LEDGERLM_WORKER_DEVICE": "cpu", "LEDGERLM_WORKER_METRICS_PORT": str(metrics_port)}


async def run_ledgerlm(model_dir: Path, prompts: Prompts, config: CapacityConfig, workdir: Path) -> dict:
    settings = platform_settings(free_port())
    async with ledgerlm_platform(model_dir, [default_tenant()], workdir, settings=settings,
                                 bench="capacity") as platform:
        scraper = WorkerScraper(f"http://127.0.0.1:{settings['LEDGERLM_WORKER_METRICS_PORT']}/metrics")
        scraping = asyncio.create_task(scraper.run())
        observe = platform_observer(platform, scraper)
        try:
            if config.client == "guidellm":
                return await guidellm_sweep(platform.target, prompts, model_dir, config, workdir, observe)
            return await sweep(platform.target, prompts, config, observe)
        finally:
            scraping.cancel()
            await asyncio.gather(scraping, return_exceptions=True)


async def run_transformers(model_dir: Path, prompts: Prompts, config: CapacityConfig, workdir: Path) -> dict:
    kv_blocks = worker_kv_blocks(model_dir, cache_bytes=TRANSFORMERS_KV_BYTES)
    async with transformers_serve(model_dir, kv_blocks, workdir) as target:
        runs = await sweep(target, prompts, config)
    for by_mix in runs.values():
        for level in by_mix["levels"]:
            level["worker_metrics_note"] = "transformers serve exposes no KV, preemption or queue metrics"
    return runs


def run_engine(model_dir: Path, prompts: Prompts, config: CapacityConfig, at: dict[str, list[int]],
               mixes: dict[str, Mix] = MIXES) -> dict:
    """The engine alone at the concurrencies `at[mix]`."""
    from bench.capacity.engine import engine_level, load_engine_alone

    engine = load_engine_alone(model_dir)
    runs = {}
    for mix, levels in at.items():
        out = []
        for c in levels:
            load = [round(x, 2) for x in os.getloadavg()]
            records, observed = engine_level(engine, prompts(mix, c), mixes[mix], c, config.duration_s,
                                             config.drain_s)
            out.append({"concurrency": c, "load_avg_at_start": load, **client_summary(records, config.duration_s),
                        **observed})
        runs[mix] = {"levels": out, "saturation": saturation(out)}
    return runs


def engine_concurrencies(config: CapacityConfig, ledgerlm: dict | None) -> dict[str, list[int]]:
    """Per mix, where the engine alone runs: every level, or ledgerlm's saturation (the top level without one)."""
    if config.engine_levels == "all":
        return {mix: list(config.levels) for mix in config.mixes}
    return {mix: [(ledgerlm or {}).get(mix, {}).get("saturation") or max(config.levels)] for mix in config.mixes}


def mark_working_sets(runs: dict[str, dict[str, dict]], config: CapacityConfig) -> dict[str, list[int]]:
    """Adds each ledgerlm level's working set (with the mean output length any server saw on the mix) and
    returns, per mix, the levels where the pool holds it."""
    where = {}
    for mix, run in runs.get("ledgerlm", {}).items():
        outputs = [(lv["output_tokens_per_request"]["mean"], lv["completed"]) for by_mix in runs.values()
                   for lv in by_mix.get(mix, {}).get("levels", []) if lv["output_tokens_per_request"]["mean"]]
        weight = sum(n for _, n in outputs)
        output = MIXES[mix].max_tokens or (sum(m * n for m, n in outputs) / weight if weight else None)
        for level in run["levels"]:
            level.update(working_set(level["concurrency"], config.prompt_tokens, output, level.get("pool_blocks")))
        where[mix] = [lv["concurrency"] for lv in run["levels"] if lv["pool_holds_working_set"]]
    return where


async def run_capacity_bench(model_dir: Path, config: CapacityConfig, workdir: Path, plots: Path | None) -> dict:
    started, load_start = time.monotonic(), [round(x, 2) for x in os.getloadavg()]
    prompts = Prompts(model_dir, config)
    runs: dict[str, dict] = {}
    unavailable: dict[str, str] = {}
    wall: dict[str, float] = {}
    for name, run in (("ledgerlm", run_ledgerlm), ("transformers_serve", run_transformers)):
        if name in config.servers:
            begun = time.monotonic()
            try:
                runs[name] = await run(model_dir, prompts, config, workdir / name)
            except TargetUnavailable as exc:  # reported in the JSON, with the reason, instead of numbers
                unavailable[name] = str(exc)
            wall[name] = round(time.monotonic() - begun, 1)
    if "engine" in config.servers:
        begun = time.monotonic()
        at = engine_concurrencies(config, runs.get("ledgerlm"))
        engine_prompts, mixes = prompts, MIXES
        if config.client == "guidellm":
            levels = runs.get("ledgerlm", {}).get("a", {}).get("levels", [])
            engine_prompts, mixes = prompts.replaying(levels), GUIDELLM_MIXES
        try:
            runs["engine"] = await asyncio.to_thread(run_engine, model_dir, engine_prompts, config, at, mixes)
        except Exception as exc:  # the servers' numbers are kept, with the reason the engine has none
            unavailable["engine"] = f"{type(exc).__name__}: {exc}"
        wall["engine"] = round(time.monotonic() - begun, 1)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "runs.json").write_text(json.dumps(runs, indent=1))  # kept should the report fail to assemble
    report = assemble(config, model_dir, runs, unavailable, load_start)
    if config.client == "guidellm":
        from bench.capacity.guidellm_targets import check_guidellm

        report["guidellm"] = check_guidellm(runs, Settings().interactive_queue_allowance_ms)
    report["server_wall_s"] = wall  # start-up, warm-up and every level of each
    if plots is not None:
        from bench.capacity.plots import write_plots

        report["plots"] = write_plots(runs, plots)
    report["wall_s"] = round(time.monotonic() - started, 1)
    return report


def assemble(config: CapacityConfig, model_dir: Path, runs: dict, unavailable: dict, load_start: list) -> dict:
    where = mark_working_sets(runs, config)
    at_saturation = ratios(runs)
    met, notes = check_targets(runs, at_saturation)
    model = json.loads((model_dir / "config.json").read_text())
    defaults = Settings()
    return {
        "bench": "capacity", "quick": config.quick, "config": asdict(config),
        "model": {"dir": str(model_dir), "model_type": model.get("model_type"), "layers": model["num_hidden_layers"],
                  "hidden_size": model["hidden_size"], "max_context": model["max_position_embeddings"],
                  "dtype": "float32", "device": "cpu"},
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": load_start,
                    "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")},
        "mixes": {name: {"prompt_tokens": config.prompt_tokens, "max_tokens": MIXES[name].max_tokens,
                         "ignore_eos": MIXES[name].ignore_eos} for name in config.mixes},
        "server_settings": {
            "ledgerlm": {"set_by_harness": sorted(platform_settings(0)), "tenant": asdict(default_tenant()),
                         "worker_kv_cache_bytes": defaults.worker_kv_cache_bytes,
                         "worker_max_num_seqs": defaults.worker_max_num_seqs,
                         "inherited_ledgerlm_env": sorted(k for k in os.environ if k.startswith("LEDGERLM_"))},
            "transformers_serve": {"kv_blocks": worker_kv_blocks(model_dir, cache_bytes=TRANSFORMERS_KV_BYTES),
                                   "block_size": 16, "per_step_tokens": PER_STEP_TOKENS,
                                   "note": "mix a's ignore_eos sent as generation_config {eos_token_id: -1}"},
            "engine": {"built_by": "consumers.worker.runtime.load_engine(Settings(worker_device='cpu'))",
                       "levels": config.engine_levels,
                       "note": "at ledgerlm's saturation level per mix only" if config.engine_levels == "saturation"
                               else "at every level",
                       **({"requests": "guidellm's own: the prompts it sent at the same level, in its order (so "
                                       "the same prefix-cache hits), rendered with the model's chat template, "
                                       "sampled at temperature 1.0 as the platform samples them (guidellm names "
                                       "no temperature)"}
                          if config.client == "guidellm" else {})}},
        "servers": runs, "unavailable": unavailable,
        "saturation": {server: {mix: run["saturation"] for mix, run in by_mix.items()}
                       for server, by_mix in runs.items()},
        "pool_holds_working_set_at": where,
        "ratios": at_saturation, "targets": TARGETS, "targets_met": met, "target_notes": notes,
        "definitions": DEFINITIONS,
    }


def configure(quick: bool, levels: str | None, duration_s: float | None, servers: str | None, mixes: str | None,
              engine_levels: str | None, client: str = "builtin") -> CapacityConfig:
    """QUICK or FULL with the command line's overrides (servers may say `transformers` for transformers_serve).

    guidellm drives ledgerlm only (transformers serve answers its requests with 422), at levels 1-16, and the
    engine alone runs at every level of its one shape (mix a)."""
    config = QUICK if quick else FULL
    if client == "guidellm":
        config = replace(config, client=client, mixes=("a",), servers=("ledgerlm", "engine"), engine_levels="all",
                         levels=(1, 4, 8) if quick else (1, 2, 4, 8, 16))
    elif client != "builtin":
        raise ValueError(f"--client: builtin or guidellm, not {client!r}")
    if levels:
        if not all(x.strip().isdigit() and int(x) > 0 for x in levels.split(",")):
            raise ValueError(f"--levels: positive integers separated by commas, not {levels!r}")
        config = replace(config, levels=tuple(int(x) for x in levels.split(",") if x.strip()))
    if duration_s is not None:
        config = replace(config, duration_s=duration_s)
    if servers:
        aliases = {"transformers": "transformers_serve"}
        config = replace(config, servers=tuple(aliases.get(s.strip(), s.strip()) for s in servers.split(",")))
    if mixes:
        config = replace(config, mixes=tuple(m.strip() for m in mixes.split(",") if m.strip()))
    if engine_levels:
        config = replace(config, engine_levels=engine_levels)
    unknown = sorted(set(config.servers) - set(SERVERS)) + sorted(set(config.mixes) - set(MIXES))
    if unknown or config.engine_levels not in ("saturation", "all"):
        raise ValueError(f"unknown servers or mixes {unknown} (servers: {', '.join(SERVERS)}; mixes: a, b; "
                         f"engine levels: saturation, all)")
    return config
