"""The platform the overhead bench measures: controller, worker, projector and gateway as processes of their own,
with the platform's default settings, in a control plane of their own (a fresh controller group) on the
running broker and database; one tenant with budgets no run reaches. Unlike the serving bench's platform
(`bench/serve/targets.py`) nothing here follows a topic from the bench process, and heartbeats keep their
default interval: every record and every CPU second is the platform's own.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.common import free_port, spawn, stop_processes, wait_for_log, wait_ready
from plumbing.compute_threads import wait_policy_env
from plumbing.settings import Settings

ROLES = ("controller", "worker", "projector", "gateway")


@dataclass(frozen=True)
class Stack:
    base_url: str
    model: str
    api_key: str
    pids: dict[str, int]
    plane: str
    bootstrap: str
    database_url: str


@asynccontextmanager
async def platform(version: str, workdir: Path) -> AsyncIterator[Stack]:
    from plumbing.kafka.groups import move_group_to_end
    from bench.common import local_endpoints
    from producers.tenant_admin import create_tenant
    from schemas.values import TenantLimits

    settings, run_id = Settings(), uuid.uuid4().hex[:8]
    plane = f"bench-overhead-{run_id}"
    bootstrap, db_url = local_endpoints(settings)
    tenant = await create_tenant(bootstrap, db_url, f"bench-overhead-{run_id}", TenantLimits(
        max_concurrency=10_000, tokens_per_minute=100_000_000, max_tokens_in_flight=10_000_000))
    await move_group_to_end(bootstrap, plane, "llm.commands")
    env = {**os.environ, "LEDGERLM_KAFKA_BOOTSTRAP": bootstrap, "LEDGERLM_DATABASE_URL": db_url,
           "LEDGERLM_CONTROLLER_GROUP": plane, **wait_policy_env()}
    workdir.mkdir(parents=True, exist_ok=True)
    logs = {role: workdir / f"{role}.log" for role in ROLES}
    port = free_port()
    procs = {"controller": spawn(["controller"], env, logs["controller"]),
             "worker": spawn(["worker", "--model-version", version, "--worker-id", f"{plane}-w1"], env, logs["worker"]),
             "projector": spawn(["project"], env, logs["projector"]),
             "gateway": spawn(["gateway", "--host", "127.0.0.1", "--port", str(port)], env, logs["gateway"])}
    try:
        await wait_for_log(logs["controller"], "controller owns partitions", procs["controller"], 120)
        await wait_for_log(logs["worker"], "worker ready", procs["worker"], 120)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await wait_ready(http, procs["gateway"], logs["gateway"])
        yield Stack(f"http://127.0.0.1:{port}", version, tenant.api_key, {r: p.pid for r, p in procs.items()},
                    plane, bootstrap, db_url)
    finally:
        stop_processes(list(procs.values()))
