"""`ledgerlm bench serve`: interactive SLOs under mixed multi-tenant load, ledgerlm vs `transformers serve`.

    phase "mixed"   one open-loop Poisson plan, replayed on each server in turn:
                      chat   weight 2  interactive mix  native API (POST /v1/generations, stream)
                      api    weight 1  interactive mix  OpenAI API (POST /v1/completions, stream)
                      docs   weight 1  long documents   native API, batch tier
                      flood  weight 1  interactive mix  native API, 4x chat's rate against a budget of
                                       2 concurrent requests and 30k tokens/minute (expect 429s)
    phase "sweep"   the interactive mix alone (tenant chat) at rising rates until the SLO fails: capacity

transformers serve has no tenants, API keys or tiers: it gets every request of the same plan as a streamed
OpenAI completion of the same prompt, so its flood tenant is served like anyone else. Both servers are up for
the whole run but take load one at a time: the mixed phase on ledgerlm then on transformers serve, each sweep
rate on both back to back. Load from elsewhere on a shared machine comes and goes over minutes: interleaving
makes it hit both alike. Idle, transformers serve used 0.3% of a core; ledgerlm's processes poll Kafka and
heartbeat (a few percent), and Kafka and PostgreSQL idle beside both.

Long documents go to the batch tier: their objective is to finish, not a first token within a second; the
batch tier lets the controller queue them for up to its batch allowance (60 s) when the worker's estimated
queue is longer than the interactive allowance (2 s), where an interactive request would get a 503, and a
client that drops a long-document stream does not cancel it. Interactive work is never queued behind them
longer than the per-step token budget allows: the worker's scheduler runs decodes first, then prefill chunks.
"""
from __future__ import annotations

import asyncio
import os
import time
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.serve.client import Target, replay
from bench.serve.metrics import DEFINITIONS, SLO, RequestRecord, capacity, ratio, summarize, summarize_group
from bench.serve.targets import (PER_STEP_TOKENS, HeartbeatSampler, TargetUnavailable, TenantSpec,
                                 ledgerlm_platform, transformers_serve, worker_kv_blocks)
from bench.serve.workload import INTERACTIVE, LONG_DOCUMENT, PlannedRequest, PromptSource, TenantLoad, plan

SLO_TENANTS = ("chat", "api")  # the tenants the interactive SLO is promised to (the flood is over budget)
TENANTS = [TenantSpec("chat", 2.0), TenantSpec("api", 1.0), TenantSpec("docs", 1.0),
           TenantSpec("flood", 1.0, max_concurrency=2, tokens_per_minute=30_000)]


@dataclass(frozen=True)
class BenchConfig:
    mixed_s: float  # length of the mixed plan (arrivals), seconds
    chat_rate: float
    api_rate: float
    docs_rate: float
    flood_rate: float
    sweep_rates: tuple[float, ...]
    sweep_s: float
    drain_s: float  # how long mixed-phase streams may run after the last send before they are cut
    seed: int = 0
    # A request that meets the SLO ends within 1 s + 127 x 50 ms = 7.4 s of its send: longer is a miss anyway.
    sweep_drain_s: float = 10.0


# --quick must end within 3 minutes on a loaded 2-core machine: transformers serve's mixed phase always runs
# to its drain bound, and the sweep stops at the first rate that misses the SLO.
QUICK = BenchConfig(mixed_s=12, chat_rate=1.0, api_rate=0.5, docs_rate=0.25, flood_rate=4.0,
                    sweep_rates=(1.0, 2.0, 4.0), sweep_s=8, drain_s=15, sweep_drain_s=8.0)
FULL = BenchConfig(mixed_s=60, chat_rate=1.0, api_rate=0.5, docs_rate=0.1, flood_rate=4.0,
                   sweep_rates=(1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0), sweep_s=30, drain_s=60)


def mixed_loads(config: BenchConfig) -> list[TenantLoad]:
    return [TenantLoad("chat", INTERACTIVE, config.chat_rate, "native", "interactive"),
            TenantLoad("api", INTERACTIVE, config.api_rate, "openai", "interactive"),
            TenantLoad("docs", LONG_DOCUMENT, config.docs_rate, "native", "batch"),
            TenantLoad("flood", INTERACTIVE, config.flood_rate, "native", "interactive")]


def sweep_load(rate: float) -> list[TenantLoad]:
    return [TenantLoad("chat", INTERACTIVE, rate, "native", "interactive")]


def prompt_source(model_dir: Path) -> PromptSource:
    from transformers import AutoTokenizer

    from engine.artifacts.demo_model import generate_corpus

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("\n".join(generate_corpus(120_000, seed=7)))["input_ids"]
    return PromptSource(ids, lambda cut: tokenizer.decode(cut, skip_special_tokens=True))


def slo_interactive(records: list[RequestRecord], window_s: float) -> dict:
    return summarize_group([r for r in records if r.mix == INTERACTIVE.name and r.tenant in SLO_TENANTS], window_s)


async def warm_up(target: Target) -> None:
    """Two short requests per API (first requests load tokenizers, allocate caches): not measured."""
    warm = [PlannedRequest(i, 0.0, "chat", "warm", api, "interactive", "the water is", 3, 4)
            for i, api in enumerate(("native", "openai", "native", "openai"))]
    _, records = await replay(target, warm, drain_s=120)
    if not any(r.completed for r in records):
        raise TargetUnavailable(f"{target.name}: warm-up got no answer: {[r.error or r.status for r in records]}")


async def settle(target: Target, within_s: float = 0.5, limit_s: float = 30.0) -> float:
    """Wait until a one-token request comes back within `within_s` (work cut at the previous phase's end may
    still be running: a server that does not cancel it would load the next phase); returns the seconds waited."""
    probe = PlannedRequest(0, 0.0, "chat", "probe", "openai", "interactive", "the water is", 3, 1)
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        _, (record,) = await replay(target, [probe], drain_s=limit_s)
        if record.completed and (record.e2e or limit_s) <= within_s:
            break
        await asyncio.sleep(0.5)
    return round(time.monotonic() - started, 2)


async def run_phase(target: Target, requests: list[PlannedRequest], window_s: float, drain_s: float,
                    heartbeats: HeartbeatSampler | None = None) -> tuple[dict, list[RequestRecord], list[dict]]:
    settled_s = await settle(target)
    load = [round(x, 2) for x in os.getloadavg()]
    t0, records = await replay(target, requests, drain_s)
    samples = heartbeats.series(t0, time.monotonic()) if heartbeats is not None else []
    return {"settled_s": settled_s, "load_avg_at_start": load, **summarize(records, window_s)}, records, samples


async def sweep_point(target: Target, rate: float, config: BenchConfig, prompts: PromptSource) -> dict:
    requests = plan(sweep_load(rate), config.sweep_s, prompts, config.seed + int(rate * 100))
    settled_s = await settle(target)
    load = [round(x, 2) for x in os.getloadavg()]
    _, records = await replay(target, requests, config.sweep_drain_s)
    return {"rate": rate, "settled_s": settled_s, "load_avg_at_start": load,
            **summarize_group(records, config.sweep_s)}


async def sweep(servers: dict[str, Target], config: BenchConfig, prompts: PromptSource) -> dict[str, list[dict]]:
    """Rising rates, each run on every server back to back (the first one alternating), so load that comes and
    goes elsewhere on the machine hits both alike; a server stops at its first rate that misses the SLO."""
    points: dict[str, list[dict]] = {name: [] for name in servers}
    for i, rate in enumerate(config.sweep_rates):
        order = list(servers) if i % 2 == 0 else list(reversed(servers))
        for name in order:
            if not points[name] or points[name][-1]["slo_holds"]:
                points[name].append(await sweep_point(servers[name], rate, config, prompts))
    return points


async def warm_all(servers: dict[str, Target]) -> dict[str, dict]:
    """Warms every server; one that answers nothing is dropped and reported unavailable with the reason."""
    unavailable = {}
    for name, target in list(servers.items()):
        try:
            await warm_up(target)
        except TargetUnavailable as exc:
            if name == "ledgerlm":
                raise
            unavailable[name] = {"unavailable": str(exc)}
            del servers[name]
    return unavailable


async def bench_servers(servers: dict[str, Target], config: BenchConfig, mixed: list[PlannedRequest],
                        prompts: PromptSource, heartbeats: HeartbeatSampler
                        ) -> tuple[dict[str, dict], dict[str, list[RequestRecord]], list[dict]]:
    """The mixed phase on each server in turn, then the interleaved sweep; heartbeats are ledgerlm's."""
    reports = await warm_all(servers)
    records: dict[str, list[RequestRecord]] = {}
    samples: list[dict] = []
    for name, target in servers.items():
        summary, records[name], series = await run_phase(
            target, mixed, config.mixed_s, config.drain_s, heartbeats if name == "ledgerlm" else None)
        reports[name] = {"mixed": summary, "slo_tenants_interactive": slo_interactive(records[name], config.mixed_s)}
        samples = series or samples
    for name, points in (await sweep(servers, config, prompts)).items():
        # The SLO still held at the highest rate swept: the capacity is at least that, not exactly it.
        reports[name].update(sweep=points, capacity_rps=capacity(points),
                             capacity_is_lower_bound=bool(points) and points[-1]["slo_holds"])
    if "ledgerlm" in reports:
        reports["ledgerlm"]["kv_queue_series"] = samples
    return reports, records, samples


async def run_serve_bench(model_dir: Path, quick: bool, workdir: Path, plots: Path | None) -> dict:
    config = QUICK if quick else FULL
    started, load_start = time.monotonic(), [round(x, 2) for x in os.getloadavg()]
    prompts = prompt_source(model_dir)
    mixed = plan(mixed_loads(config), config.mixed_s, prompts, config.seed)
    kv_blocks = worker_kv_blocks(model_dir)
    async with AsyncExitStack() as stack:
        platform = await stack.enter_async_context(ledgerlm_platform(model_dir, TENANTS, workdir / "ledgerlm"))
        servers = {"ledgerlm": platform.target}
        try:
            servers["transformers_serve"] = await stack.enter_async_context(
                transformers_serve(model_dir, kv_blocks, workdir / "transformers"))
            down = {}
        except TargetUnavailable as exc:
            down = {"transformers_serve": {"unavailable": str(exc)}}
        targets, records, samples = await bench_servers(servers, config, mixed, prompts, platform.heartbeats)
    report = assemble(config, quick, model_dir, mixed, {**down, **targets}, kv_blocks, load_start)
    if plots is not None:
        from bench.serve.plots import write_plots

        report["plots"] = write_plots(records, samples, 1.0, plots)
    report["wall_s"] = round(time.monotonic() - started, 1)
    return report


def comparison(targets: dict[str, dict]) -> dict:
    ours, theirs = targets["ledgerlm"], targets["transformers_serve"]
    if "unavailable" in theirs:
        return {"goodput_ratio_vs_transformers_serve": None, "capacity_ratio_vs_transformers_serve": None,
                "ratio_note": f"transformers serve unavailable: {theirs['unavailable']}"}
    good = (ours["slo_tenants_interactive"]["goodput_rps"], theirs["slo_tenants_interactive"]["goodput_rps"])
    cap = (ours["capacity_rps"], theirs["capacity_rps"])
    notes = [f"transformers serve {name} is 0: ratio undefined (ledgerlm {value[0]})"
             for name, value in (("goodput", good), ("capacity", cap)) if value[1] == 0]
    counts = (ours["slo_tenants_interactive"]["good"], theirs["slo_tenants_interactive"]["good"])
    return {"goodput_ratio_vs_transformers_serve": ratio(*good), "capacity_ratio_vs_transformers_serve": ratio(*cap),
            # As if transformers serve had had at least one good request: a floor when its goodput is 0.
            "goodput_ratio_lower_bound": ratio(float(counts[0]), float(max(counts[1], 1))),
            "goodput_rps": {"ledgerlm": good[0], "transformers_serve": good[1]},
            "capacity_rps": {"ledgerlm": cap[0], "transformers_serve": cap[1]},
            "ratio_note": "; ".join(notes) or "goodput: interactive requests of tenants chat and api in the mixed "
                                               "phase; capacity: the interactive sweep"}


def assemble(config: BenchConfig, quick: bool, model_dir: Path, mixed: list[PlannedRequest], targets: dict,
             kv_blocks: int, load_start: list[float]) -> dict:
    import json

    model_config = json.loads((model_dir / "config.json").read_text())
    return {
        "bench": "serve", "quick": quick, "config": asdict(config),
        "model": {"dir": str(model_dir), "hidden_size": model_config["hidden_size"],
                  "layers": model_config["num_hidden_layers"], "vocab": model_config["vocab_size"],
                  "max_context": model_config["max_position_embeddings"], "dtype": "float32", "device": "cpu"},
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": load_start,
                    "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")},
        "slo": {"ttft_s": SLO.ttft_s, "itl_s": SLO.itl_s}, "definitions": DEFINITIONS,
        "tenants": [asdict(t) for t in TENANTS], "slo_tenants": list(SLO_TENANTS),
        "mixed_plan": {"requests": len(mixed),
                       "by_tenant": {t: sum(r.tenant == t for r in mixed) for t in sorted({r.tenant for r in mixed})},
                       "prompt_tokens": sum(r.prompt_tokens for r in mixed),
                       "max_output_tokens": sum(r.max_output_tokens for r in mixed)},
        "server_settings": {"kv_blocks": kv_blocks, "block_size": 16, "per_step_tokens": PER_STEP_TOKENS},
        **comparison(targets), "servers": targets,  # the servers under test, side by side
        "target_goodput_ratio": 1.5,
    }
