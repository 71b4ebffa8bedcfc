"""The two servers the serving bench compares, each started fresh and stopped after its load.

    ledgerlm            controller + worker + projector + gateway processes (as `ledgerlm up` runs them) in a
                        control plane of their own (a fresh controller group) on the running broker and
                        database; tenants created for the run;
                        the worker's heartbeats on `llm.workers` sampled for KV blocks and queue depth
    transformers serve  `transformers serve MODEL --continuous-batching` on CPU, float32, its KV pool and
                        per-step token budget set to the worker's (as many blocks of 16 tokens, 512 tokens)
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.common import free_port, spawn, stop_processes, wait_for_log, wait_ready
from bench.serve.client import Target
from plumbing.compute_threads import wait_policy_env
from plumbing.settings import REPO_ROOT, Settings

HEARTBEAT_INTERVAL_MS = 500
# Room for many long documents (4,600 tokens each) beside the interactive work: 131,072 tokens on the mini
# model (2 KiB of KV per token), 32,768 on the small one (8 KiB); the worker's default 64 MiB is a quarter.
WORKER_KV_CACHE_BYTES = 256 * 1024 * 1024
PER_STEP_TOKENS = 512  # EngineConfig.max_num_batched_tokens, the worker's default


@dataclass(frozen=True)
class TenantSpec:
    """A tenant of the run: its logical name in the report, its fair-share weight and budgets."""

    name: str
    weight: float
    max_concurrency: int = 10_000
    tokens_per_minute: int = 100_000_000
    max_tokens_in_flight: int = 10_000_000


class HeartbeatSampler:
    """Follows `llm.workers` from now on and keeps one worker's capacity samples."""

    def __init__(self, bootstrap: str, worker_id: str) -> None:
        from plumbing.kafka.follower import Follower
        from schemas.topics import WORKERS

        self.worker_id = worker_id
        self.samples: list[dict] = []
        self.follower = Follower(bootstrap, [WORKERS], self.on_workers, start="end", client_id="bench-serve-hb")

    def on_workers(self, topic: str, event) -> None:
        if getattr(event, "worker_id", None) != self.worker_id or not hasattr(event, "free_blocks"):
            return
        self.samples.append({"t": time.monotonic(), "used_blocks": event.total_blocks - event.free_blocks,
                             "free_blocks": event.free_blocks, "total_blocks": event.total_blocks,
                             "running": event.running, "queued_tokens": event.queued_tokens,
                             "decode_step_ms": event.decode_step_ms, "prefill_token_ms": event.prefill_token_ms,
                             "max_batched_tokens": event.max_batched_tokens, "step_ms": event.step_ms,
                             "ttft_error_ms": event.ttft_error_ms, "prefix_hit_share": event.prefix_hit_share})

    def series(self, t0: float, t1: float) -> list[dict]:
        """Samples within [t0, t1], times relative to t0."""
        return [{**s, "t": round(s["t"] - t0, 3)} for s in self.samples if t0 <= s["t"] <= t1]


@dataclass(frozen=True)
class Platform:
    target: Target
    heartbeats: HeartbeatSampler
    worker_id: str
    plane: str
    pids: dict[str, int] = field(default_factory=dict)  # role -> process id


# What the serving bench sets beyond the endpoints; `ledgerlm_platform(settings=...)` replaces it (the capacity
# bench runs with the defaults and sets only the worker's device and metrics port).
SERVE_SETTINGS = {"LEDGERLM_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_INTERVAL_MS),
                  "LEDGERLM_WORKER_KV_CACHE_BYTES": str(WORKER_KV_CACHE_BYTES)}


def role_env(bootstrap: str, db_url: str, plane: str, settings: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "LEDGERLM_KAFKA_BOOTSTRAP": bootstrap, "LEDGERLM_DATABASE_URL": db_url,
            "LEDGERLM_CONTROLLER_GROUP": plane, **(SERVE_SETTINGS if settings is None else settings),
            **wait_policy_env()}


@asynccontextmanager
async def ledgerlm_platform(model_dir: Path, tenants: list[TenantSpec], workdir: Path,
                            settings: dict[str, str] | None = None, bench: str = "serve") -> AsyncIterator[Platform]:
    """`settings`: LEDGERLM_* variables for every role (default SERVE_SETTINGS); `bench` names the plane."""
    import asyncio

    from plumbing.kafka.groups import move_group_to_end
    from bench.common import local_endpoints
    from producers.model_registry import describe, register_model
    from producers.tenant_admin import create_tenant
    from schemas.values import TenantLimits

    run_id = uuid.uuid4().hex[:8]
    plane, local = f"bench-{bench}-{run_id}", Settings()
    bootstrap, db_url = local_endpoints(local)
    version = f"bench-{describe(model_dir, 'probe').content_sha256[:8]}@1"
    await register_model(bootstrap, model_dir, version)
    keys = {}
    for spec in tenants:
        created = await create_tenant(bootstrap, db_url, f"bench-{spec.name}-{run_id}", TenantLimits(
            weight=spec.weight, max_concurrency=spec.max_concurrency, tokens_per_minute=spec.tokens_per_minute,
            max_tokens_in_flight=spec.max_tokens_in_flight))
        keys[spec.name] = created.api_key
    await move_group_to_end(bootstrap, plane, "llm.commands")
    env, worker_id, port = role_env(bootstrap, db_url, plane, settings), f"{plane}-w1", free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    logs = {role: workdir / f"{role}.log" for role in ("controller", "worker", "gateway", "projector")}
    procs = [spawn(["controller"], env, logs["controller"]),
             spawn(["worker", "--model-version", version, "--worker-id", worker_id], env, logs["worker"]),
             spawn(["gateway", "--host", "127.0.0.1", "--port", str(port)], env, logs["gateway"]),
             # The resume buffer the gateway fills a stream's gaps from (without it a late view ends the
             # stream with `cursor_expired`).
             spawn(["project"], env, logs["projector"])]
    sampler = HeartbeatSampler(bootstrap, worker_id)
    try:
        await wait_for_log(logs["controller"], "controller owns partitions", procs[0], 120)
        # Loading the model niced beside busy processes is slow (2 min 20 s beside 4 CPU hogs on 2 cores).
        await wait_for_log(logs["worker"], "worker ready", procs[1], 600)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await wait_ready(http, procs[2], logs["gateway"])
        await sampler.follower.start()
        following = asyncio.create_task(sampler.follower.run())
        try:
            yield Platform(Target("ledgerlm", f"http://127.0.0.1:{port}", version, keys), sampler, worker_id, plane,
                           {role: proc.pid for role, proc in zip(("controller", "worker", "gateway", "projector"),
                                                                 procs)})
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            await sampler.follower.stop()
    finally:
        stop_processes(procs)


def worker_kv_blocks(model_dir: Path, block_size: int = 16, cache_bytes: int = WORKER_KV_CACHE_BYTES) -> int:
    """A KV pool of `cache_bytes` (default the serving bench's worker's) in blocks, over the bytes per token of
    docs/design-rules.md (float32)."""
    import json

    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
    return cache_bytes // (block_size * per_token)


def with_architectures(model_dir: Path, view: Path) -> Path:
    """`model_dir`, or when its config.json names no `architectures` (a GGUF import), a view of it in `view`:
    links to its files and a config naming the causal-LM class of its model_type, which transformers serve's
    loader needs."""
    import json

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = json.loads((model_dir / "config.json").read_text())
    if config.get("architectures"):
        return model_dir
    view.mkdir(parents=True, exist_ok=True)
    for source in model_dir.iterdir():
        link = view / source.name
        if source.name != "config.json" and not link.exists():
            link.symlink_to(source.resolve())
    config["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config["model_type"]]]
    (view / "config.json").write_text(json.dumps(config, indent=2))
    return view


class TargetUnavailable(RuntimeError):
    """The server could not be started or answered nothing; the report carries the reason instead of numbers."""


def transformers_serve_command(model_dir: Path, port: int, kv_blocks: int) -> list[str]:
    return [str(Path(sys.executable).parent / "transformers"), "serve", str(model_dir), "--continuous-batching",
            "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
            "--cb-block-size", "16", "--cb-num-blocks", str(kv_blocks),
            "--cb-max-batch-tokens", str(PER_STEP_TOKENS), "--log-level", "warning"]


@asynccontextmanager
async def transformers_serve(model_dir: Path, kv_blocks: int, workdir: Path) -> AsyncIterator[Target]:
    """Needs `transformers[serving]` (fastapi, uvicorn, openai) and accelerate (its model loading uses a
    device_map); raises TargetUnavailable with the reason when it cannot start."""
    port, log = free_port(), workdir / "transformers_serve.log"
    workdir.mkdir(parents=True, exist_ok=True)
    served = with_architectures(model_dir, workdir / "model")
    command = transformers_serve_command(served, port, kv_blocks)
    env = {**os.environ, **wait_policy_env()}
    proc = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            try:
                await wait_ready(http, proc, log, timeout_s=120, path="/health")
            except RuntimeError as exc:
                raise TargetUnavailable(str(exc)[-600:]) from None
        yield Target("transformers_serve", f"http://127.0.0.1:{port}", str(served), native=False)
    finally:
        stop_processes([proc])
