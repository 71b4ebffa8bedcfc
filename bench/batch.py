"""`ledgerlm bench batch`: N batch generations posted at once by one tenant, on the real model, default settings.

    platform   controller, worker, projector, gateway (as `ledgerlm up` runs them), default settings, the real model
    tenants    "batch" (budgets that hold the whole burst), "chat" (the defaults) for the interactive sweep
    burst      N native `POST /v1/generations` with `tier: batch`, `maxOutputTokens` 4, all sent at once
    beside     optionally C closed-loop streamed chats (mix a) from "chat" while the burst runs
    outcome    read from `llm.generations`: the terminal event of every generation of the burst

Reports what a batch customer and the operator see: how many were accepted and how many completed, expired or
ended otherwise, the time to the last one, output tok/s, how busy the engine was (heartbeats with work
running), the most attempts the worker held at once (the controller holds the rest) and how often the worker
fenced itself (its log's `self-fenced` lines); with the sweep, the interactive TTFT and ITL. Targets: all N
completed, none expired, the engine busy throughout, no self-fencing, and with the sweep its TTFT p95 within the
allowance.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.capacity.client import MIXES, closed_loop
from bench.capacity.metrics import client_summary
from bench.capacity.run import CapacityConfig, Prompts, platform_settings
from bench.common import free_port, local_endpoints
from bench.overhead.run import load_average
from bench.serve.targets import Platform, TenantSpec, ledgerlm_platform
from plumbing.settings import Settings

TERMINAL = ("Completed", "Expired", "Failed", "Canceled", "Rejected", "Interrupted")
WORDS = ("river", "lamp", "orbit", "maple", "copper", "harbor", "violet", "signal", "meadow", "quartz")
BATCH_TENANT = TenantSpec("batch", 1.0, max_concurrency=100_000, tokens_per_minute=1_000_000_000,
                          max_tokens_in_flight=100_000_000)
CHAT_TENANT = TenantSpec("chat", 1.0)


@dataclass(frozen=True)
class BatchConfig:
    count: int = 1000
    output_tokens: int = 4
    interactive: int = 0  # closed-loop chats beside the burst (0: none) ...
    interactive_s: float = 90.0  # ... sending for this long from the burst's start
    timeout_s: float = 1800.0
    # Connections the burst is sent over. The load generator shares the platform's 2 cores: over 64, httpx's
    # pool (which looks at every connection for each request it places) took 0.65 of a core during the burst.
    post_concurrency: int = 16


def batch_input(index: int) -> str:
    """A short, distinct instruction per request (distinct so the prefix cache does not make the burst free)."""
    words = " ".join(WORDS[(index * 7 + k) % len(WORDS)] for k in range(6))
    return f"Request {index}: write one word that rhymes with the first of: {words}."


class Outcomes:
    """The terminal events of a set of generations, followed on `llm.generations` from now on."""

    def __init__(self, bootstrap: str) -> None:
        from plumbing.kafka.follower import Follower
        from schemas.topics import GENERATIONS

        self.wanted: set[str] = set()
        self.ended: dict[str, tuple[str, int, float]] = {}  # generation id -> (terminal type, output tokens, at)
        self.repeats = 0
        self.follower = Follower(bootstrap, [GENERATIONS], self.on_event, start="end", client_id="bench-batch")

    def on_event(self, topic: str, event) -> None:
        """Every terminal event is kept: the first ones arrive before the burst's ids are all known."""
        if event.type not in TERMINAL:  # tokens' lifecycle neighbours, and period markers (no generation)
            return
        if event.generation_id in self.ended:
            self.repeats += 1
            return
        usage = getattr(event, "usage", None)
        self.ended[event.generation_id] = (event.type, usage.generated_output_tokens if usage is not None else 0,
                                           time.monotonic())

    def done(self) -> bool:
        return self.wanted <= set(self.ended)

    def mine(self) -> list[tuple[str, int, float]]:
        return [self.ended[g] for g in self.wanted if g in self.ended]

    @property
    def output_tokens(self) -> int:
        return sum(tokens for _, tokens, _ in self.mine())

    @property
    def last_end(self) -> float | None:
        return max((at for _, _, at in self.mine()), default=None)

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(TERMINAL, 0)
        for kind, _, _ in self.mine():
            counts[kind] += 1
        return {kind.lower(): n for kind, n in counts.items()}


async def post_burst(platform: Platform, config: BatchConfig) -> list[httpx.Response | Exception]:
    """Every request of the burst at once, `post_concurrency` in flight. (Handed all at once, httpx's pool
    rescans its whole queue on every connection event: with 1,000 queued the bench's own event loop was 94 %
    busy there, posted ~35 a second and stamped its chats' chunks late.)"""
    headers = {"Authorization": f"Bearer {platform.target.keys['batch']}"}
    limits = httpx.Limits(max_connections=config.post_concurrency)
    in_flight = asyncio.Semaphore(config.post_concurrency)
    async with httpx.AsyncClient(base_url=platform.target.base_url, timeout=120, limits=limits) as client:
        async def one(index: int):
            body = {"requestId": f"batch-{uuid.uuid4().hex}", "model": platform.target.model,
                    "input": batch_input(index), "maxOutputTokens": config.output_tokens, "tier": "batch",
                    "ignoreEos": True}
            try:
                async with in_flight:
                    return await client.post("/v1/generations", json=body, headers=headers)
            except httpx.HTTPError as exc:
                return exc

        return await asyncio.gather(*(one(i) for i in range(config.count)))


def busy_share(samples: list[dict]) -> float | None:
    """The share of heartbeats from the first that shows work on the worker to the burst's end that show the
    worker running something (the posting before the first dispatch is not the engine's idleness)."""
    first = next((i for i, s in enumerate(samples) if s["running"] > 0), None)
    if first is None:
        return None
    busy = samples[first:]
    return round(sum(1 for s in busy if s["running"] > 0) / len(busy), 3)


def timeline(samples: list[dict], every_s: float = 5.0) -> list[dict]:
    """One heartbeat every `every_s` from the burst's start: what the worker ran and the step it measured (the
    controller's prediction reads the same fields)."""
    kept, next_t = [], 0.0
    for s in samples:
        if s["t"] >= next_t:
            kept.append({k: (round(v, 1) if isinstance(v, float) else v) for k, v in s.items()
                         if k in ("t", "running", "queued_tokens", "step_ms", "decode_step_ms", "prefill_token_ms",
                                  "ttft_error_ms")})
            next_t = s["t"] + every_s
    return kept


def chat_ttfts(records) -> list[list[float]]:
    """[sent at, TTFT] in seconds of every completed chat, in order of sending: where in the burst they waited."""
    return [[round(r.sent_at, 2), round(r.ttft, 3)] for r in sorted(records, key=lambda r: r.sent_at)
            if r.ttft is not None and r.error is None and r.status == 200]


def self_fenced_lines(worker_log: Path) -> int | None:
    """How often the worker fenced itself (gave up its attempts for want of an acknowledged heartbeat), from its
    log (None: no log)."""
    if not worker_log.exists():
        return None
    with worker_log.open(errors="replace") as lines:
        return sum(1 for line in lines if "self-fenced" in line)


async def wait_outcomes(outcomes: Outcomes, deadline: float) -> None:
    while not outcomes.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.5)


async def run_batch_bench(model_dir: Path, config: BatchConfig, workdir: Path) -> dict:
    settings = Settings()
    bootstrap, _ = local_endpoints(settings)
    async with ledgerlm_platform(model_dir, [BATCH_TENANT, CHAT_TENANT], workdir,
                                 settings=platform_settings(free_port()), bench="batch") as platform:
        outcomes = Outcomes(bootstrap)
        await outcomes.follower.start()
        following = asyncio.create_task(outcomes.follower.run())
        try:
            chats = None
            if config.interactive:
                chats = Prompts(model_dir, CapacityConfig(levels=(config.interactive,), duration_s=config.interactive_s,
                                                          drain_s=60, mixes=("a",)))("a", config.interactive)
            load, began = load_average(), time.monotonic()
            sweep = None
            if chats is not None:
                sweep = asyncio.create_task(closed_loop(platform.target, chats,
                                                        MIXES["a"], config.interactive, config.interactive_s, 60))
            responses = await post_burst(platform, config)
            posted_s = time.monotonic() - began
            accepted = [r.json()["id"] for r in responses if isinstance(r, httpx.Response) and r.status_code == 201]
            outcomes.wanted = set(accepted)
            await wait_outcomes(outcomes, began + config.timeout_s)
            ended_s = (outcomes.last_end or time.monotonic()) - began
            interactive = None
            if sweep is not None:
                sweep_t0, records = await sweep
                interactive = client_summary(records, config.interactive_s)
                for r in records:  # the sweep's clock starts a moment after the burst's
                    r.sent_at += sweep_t0 - began
                interactive["ttft_s_by_sent_at"] = chat_ttfts(records)
            samples = platform.heartbeats.series(began, began + ended_s)
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            await outcomes.follower.stop()
    statuses: dict[str, int] = {}
    for r in responses:
        key = str(r.status_code) if isinstance(r, httpx.Response) else type(r).__name__
        statuses[key] = statuses.get(key, 0) + 1
    counts = outcomes.counts()
    report = {
        "bench": "batch", "config": config.__dict__, "load_avg_at_start": load, "load_avg_at_end": load_average(),
        "posted": config.count, "post_statuses": statuses, "accepted": len(accepted), "post_s": round(posted_s, 2),
        "outcomes": counts, "unfinished": len(outcomes.wanted - set(outcomes.ended)),
        "repeated_terminal_events": outcomes.repeats, "last_end_s": round(ended_s, 2),
        "output_tokens": outcomes.output_tokens,
        "output_tok_s": round(outcomes.output_tokens / ended_s, 2) if ended_s > 0 else None,
        "engine_busy_share": busy_share(samples),
        "worker_attempts_max": max((s["running"] for s in samples), default=None),
        "worker_queued_tokens_max": max((s["queued_tokens"] for s in samples), default=None),
        "worker_self_fenced_log_lines": self_fenced_lines(workdir / "worker.log"),
        "worker_timeline": timeline(samples),
        "interactive": interactive,
    }
    report["targets"] = {
        "all_completed": counts["completed"] == config.count,
        "none_expired": counts["expired"] == 0,
        "engine_busy_throughout": report["engine_busy_share"] is not None and report["engine_busy_share"] >= 0.95,
        "no_self_fencing": report["worker_self_fenced_log_lines"] == 0,
        "interactive_ttft_p95_within_allowance": None if interactive is None else (
            (interactive["ttft_ms"].get("p95") or float("inf")) <= settings.interactive_queue_allowance_ms),
    }
    return report

