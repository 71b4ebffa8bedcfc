"""Control-plane fixtures: real Kafka and Postgres, a controller process, in-process workers and gateway.

With the project's own local broker, every role here reaches Kafka through its
SASL_PLAINTEXT (SCRAM) listener as a principal of its own (`cp_kafka`,
`cp_env`); the shared fixtures and helpers that are not roles stay on PLAINTEXT.

The controller runs as a real process (so a test can kill -9 it) in a consumer
group of its own, started at the current end of `llm.commands`; workers run
in this process (their engines share one torch import) unless a test needs
to kill one. Tenants are created before the controller starts, so its tenant
registry already holds them when the first command arrives.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from plumbing.kafka.groups import move_group_to_end
from plumbing.settings import Settings
from schemas.values import TenantLimits
from tests.waiting import wait_until

SESSION = uuid.uuid4().hex[:8]
BLOCK = 16

ENV = {
    "LEDGERLM_CONTROLLER_GROUP": f"test-controller-{SESSION}",
    # Short enough that the tests of a lost worker end quickly, long enough for a loaded 2-core machine: the
    # test process runs the gateway and several workers' engines on one interpreter.
    "LEDGERLM_LEASE_MS": "3000",
    "LEDGERLM_HEARTBEAT_INTERVAL_MS": "300",
    "LEDGERLM_LEASE_CHECK_INTERVAL_MS": "100",
    "LEDGERLM_USAGE_REPORT_TOKENS": "4",
    "LEDGERLM_USAGE_REPORT_MS": "200",
    "LEDGERLM_STREAM_FLUSH_MS": "0",  # one stream event per engine step: exact seqs to assert
    "LEDGERLM_RETRY_AFTER_MS": "1000",
    "LEDGERLM_ADMISSION_TIMEOUT_MS": "20000",
    # Queueing tests must not turn into 503s when a loaded machine makes the workers' measured rates drop:
    # a 10 s allowance (5 s of predicted wait) keeps every wait these tests create within it.
    "LEDGERLM_INTERACTIVE_QUEUE_ALLOWANCE_MS": "10000",
    "LEDGERLM_WORKER_DEVICE": "cpu",
    "LEDGERLM_WORKER_KV_CACHE_BYTES": str(256 * BLOCK * 512),  # 256 blocks of the tiny model (512 B/token)
}

TENANTS = {  # name suffix -> limits
    "main": TenantLimits(),
    "other": TenantLimits(),
    "single": TenantLimits(max_concurrency=1),
    "kill": TenantLimits(max_concurrency=1),
    "restart": TenantLimits(max_concurrency=1),
    "drain": TenantLimits(),
    "metrics": TenantLimits(),  # test_metrics.py's own, so its per-tenant counters are exact
}


@dataclass
class Tenant:
    tenant_id: str
    api_key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@pytest.fixture(scope="session")
def cp_settings(services) -> Settings:
    return Settings(**{k.removeprefix("LEDGERLM_").lower(): v for k, v in ENV.items()})


@pytest.fixture(scope="session")
def cp_kafka(services, bootstrap):
    """role -> how that role reaches Kafka: the SASL listener as its own principal when there is one."""
    from tests.services import sasl_access

    return lambda role: sasl_access(services, Settings(), role) or bootstrap


@pytest.fixture(scope="session")
def cp_env(services, database_url, cp_kafka) -> dict[str, str]:
    """The environment of role processes: over SASL as `controller` when the local broker has a SASL listener."""
    env = {**os.environ, **ENV, "LEDGERLM_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
           "LEDGERLM_DATABASE_URL": database_url}
    access = cp_kafka("controller")
    if not isinstance(access, str):
        env.update({"LEDGERLM_KAFKA_BOOTSTRAP": access.bootstrap, "LEDGERLM_KAFKA_SECURITY_PROTOCOL": access.protocol,
                    "LEDGERLM_KAFKA_SASL_USERNAME": access.principal.username,
                    "LEDGERLM_KAFKA_SASL_PASSWORD": access.principal.password.get_secret_value()})
    return env


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    from engine.artifacts.demo_model import build_demo_model

    # Untrained weights: deterministic, and they almost never sample the end token, so lengths are exact.
    return build_demo_model(tmp_path_factory.mktemp("cp-models") / "tiny", size="tiny", train_steps=0,
                            progress=False)


@pytest.fixture(scope="session")
async def versions(bootstrap, topics, model_dir) -> dict[str, str]:
    """Registered versions: `served` (shared workers), `drained`/`killable`/`paced`/... (one test's own), `idle` (no worker),
    `stable`/`canary` (the same files under two names: an alias's members)."""
    from producers.model_registry import register_model

    names = {role: f"cp-{role}-{SESSION}@1"
             for role in ("served", "drained", "killable", "batch", "coalesced", "idle", "stable", "canary",
                          "failing", "crashing", "refusing", "paced")}
    for name in names.values():
        await register_model(bootstrap, model_dir, name)
    return names


@pytest.fixture(scope="session")
async def tenants(bootstrap, database_url, topics) -> dict[str, Tenant]:
    from producers.tenant_admin import create_tenant

    made = {}
    for role, limits in TENANTS.items():
        created = await create_tenant(bootstrap, database_url, f"cp-{role}-{SESSION}", limits)
        made[role] = Tenant(created.tenant_id, created.api_key)
    return made


class Process:
    """A `ledgerlm` role as a real process, its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Process":
        self.proc = subprocess.Popen([sys.executable, "-m", "ledgerlm.cli.main", *self.args], env=self.env,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        return self

    async def wait_for_log(self, fragment: str, timeout_s: float, after: int = 0) -> None:
        def logged() -> bool:
            text = self.log.read_text(errors="replace")
            if fragment in text[after:]:
                return True
            assert self.proc.poll() is None, f"{self.args[0]} exited {self.proc.returncode}:\n{text[-3000:]}"
            return False

        await wait_until(logged, timeout_s, step_s=0.1,
                         what=lambda _: f"{self.args[0]} to log {fragment!r}:\n{self.log.read_text()[-3000:]}")

    async def metrics_url(self, timeout_s: float = 30) -> str:
        """Where this role's /metrics, /healthz and /readyz listen (the port its latest start logged)."""
        import re

        await self.wait_for_log("metrics listening", timeout_s)
        host, port = re.findall(r"metrics listening role=\S+ host=(\S+) port=(\d+)", self.log.read_text())[-1]
        return f"http://{host}:{port}"

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    from infra.ports import listen_port

    return listen_port()


async def start_gateway_process(env: dict[str, str], log: Path, port: int, timeout_s: float = 60) -> Process:
    """`ledgerlm gateway --port PORT` as a process, returned once its /readyz answers 200."""
    proc = Process(["gateway", "--port", str(port)], env, log).start()

    async def ready() -> bool:
        assert proc.proc.poll() is None, log.read_text()[-3000:]
        try:
            return (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    async with httpx.AsyncClient(timeout=5) as client:
        try:
            await wait_until(ready, timeout_s, step_s=0.2,
                             what=lambda _: f"the gateway ready:\n{log.read_text()[-3000:]}")
        except AssertionError:
            proc.stop()
            raise
    return proc


@pytest.fixture(scope="session")
async def controller(bootstrap, cp_env, cp_settings, tenants, versions, tmp_path_factory):
    await move_group_to_end(bootstrap, cp_settings.controller_group, "llm.commands")
    proc = Process(["controller"], cp_env, tmp_path_factory.mktemp("cp-logs") / "controller.log").start()
    await proc.wait_for_log("controller owns partitions", 60)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
async def engine_artifacts(model_dir):
    from engine.artifacts.model_dir import load_artifacts

    return await asyncio.to_thread(load_artifacts, model_dir)


@pytest.fixture(scope="session")
def worker_tasks() -> dict:
    """Worker id -> the task running that worker, for start_worker's workers: a test can see how one ended."""
    return {}


@pytest.fixture(scope="session")
async def start_worker(bootstrap, cp_kafka, cp_settings, versions, engine_artifacts, model_dir, worker_tasks):
    """start_worker(version_role="served", blocks=256) -> a running in-process Worker (stopped at session end).

    `version_role` is a role of `versions`, or the name of a version a test registered itself (same weights)."""
    from consumers.worker.runtime import Worker
    from engine.config import EngineConfig
    from engine.engine import Engine
    from producers.model_registry import registered_versions

    registered = await registered_versions(bootstrap)
    running: list[tuple] = []

    async def start(version_role: str = "served", blocks: int = 256, worker_id: str | None = None,
                    reservation: str = "full", **overrides):
        name = versions.get(version_role, version_role)
        if name not in registered:
            registered.update(await registered_versions(bootstrap))
        model = registered[name]
        settings = cp_settings.model_copy(update=overrides)
        config = EngineConfig(kv_cache_bytes=blocks * BLOCK * 512, block_size=BLOCK, reservation=reservation,
                              free_block_watermark=settings.worker_free_block_watermark, dtype="float32",
                              device="cpu", tenant_weights={}, expected_checksums=model.checksums)
        engine = Engine(model_dir, config, artifacts=engine_artifacts)
        worker = Worker(settings, cp_kafka("worker"), model, engine, worker_id or f"cp-worker-{uuid.uuid4().hex[:6]}")
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(worker.ready.wait(), 30)
        running.append((worker, task))
        worker_tasks[worker.worker_id] = task
        return worker

    yield start
    for worker, task in running:
        if not task.done():
            task.cancel()
    for _, task in running:
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass


@pytest.fixture(scope="session")
async def worker(start_worker, controller, cp_settings, gateway, versions):
    control = await controller.metrics_url()
    live_before = value(await scrape(control), "ledgerlm:workers_live")
    worker = await start_worker("served")
    started = time.monotonic()
    # Two heartbeats in the log after its start: the controller's registry and the gateway's board have it.
    await wait_until(lambda: worker.last_heartbeat_ok > started + cp_settings.heartbeat_interval_ms / 1000, 30,
                     what="the worker's heartbeats acknowledged")
    # and the controller has read them (on a loaded machine, seconds later: a first request got 503 before)
    await wait_until(lambda: scrape(control), 60, step_s=0.2,
                     accept=lambda samples: value(samples, "ledgerlm:workers_live") >= live_before + 1,
                     what=lambda samples: f"the controller to count the worker live (workers_live "
                                          f"{value(samples, 'ledgerlm:workers_live')}, before {live_before})")
    # and the gateway has read them too: until then it answers 503 at once, its early refusal (a first request
    # got "no live worker serves ..." on a loaded machine); this is the very check it makes
    served, routes = versions["served"], gateway.gateway
    await wait_until(lambda: routes.board.could_serve(routes.catalog.versions_of(served), 1, time.time(),
                                                      routes.workers_follower.read_through()), 60, step_s=0.1,
                     what="the gateway's board to count the worker live")
    return worker


def pace_steps(engine, seconds: float) -> None:
    """Each engine step takes at least `seconds`: a generation outlasts what a test does meanwhile."""
    step = engine.step

    def paced():
        started = time.monotonic()
        outputs = step()
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))  # the engine thread's own pace, not a wait
        return outputs

    engine.step = paced


@pytest.fixture(scope="session")
async def paced_worker(start_worker, controller):
    """The one worker of `paced`, every engine step at least 10 ms: a 400-token generation lasts 4 s or more,
    so a cancel a test sends after its first tokens lands before its end however loaded the machine is (the
    tiny model alone can finish 400 tokens before a cancel's round trip)."""
    worker = await start_worker("paced")
    pace_steps(worker.engine, 0.01)
    return worker


@pytest.fixture(scope="session")
async def gateway(cp_kafka, database_url, cp_settings, versions, controller):
    from producers.gateway.http.app import create_app

    # This gateway reads and decodes every partition, as gateways did before they shared the token stream, so
    # a test can watch any generation's tokens on its bridge; sharing is tested with gateway processes
    # (test_gateway_sharing.py, test_read_your_writes.py).
    app = create_app(cp_settings.model_copy(update={"gateway_share_stream": False}), cp_kafka("gateway"),
                     database_url)
    await app.state.gateway.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=60)
    client.gateway = app.state.gateway
    await wait_ready(client)  # the bridge has replayed and the key directory caught up
    yield client
    await client.aclose()
    await app.state.gateway.stop()


Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def scrape(url: str) -> Samples:
    """A role's /metrics, parsed."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{url}/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def body(request_id: str | None = None, model: str = "", **fields) -> dict:
    return {"requestId": request_id or f"req-{uuid.uuid4().hex[:10]}", "model": model,
            "input": "the water is", "maxOutputTokens": 8, **fields}


def parse_sse(text: str) -> list[tuple[str, dict]]:
    import json

    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        events.append((lines["event"], json.loads(lines["data"])))
    return events


async def own_version(bootstrap, model_dir, gateway, role: str) -> str:
    """A version only this test's workers serve: no other test's requests reach them, nor theirs its own
    (workers started by a test run until the session ends)."""
    from producers.model_registry import register_model

    version = f"cp-{role}-{SESSION}@1"
    await register_model(bootstrap, model_dir, version)
    await wait_until(lambda: version in gateway.gateway.catalog.versions, 10, what="the gateway to see it")
    return version


async def wait_ready(client: httpx.AsyncClient, timeout_s: float = 60) -> None:
    """Until the gateway's /readyz answers 200."""
    await wait_until(lambda: client.get("/readyz"), timeout_s, step_s=0.1, accept=lambda r: r.status_code == 200,
                     what=lambda r: f"the gateway ready: {r.text}")


async def post_until_admitted(client, url: str, timeout_s: float = 30, **kwargs):
    """POST, again while the answer is 503 (a worker started just now is not yet live to the controller), as a
    client honouring Retry-After does; the first other answer."""
    return await wait_until(lambda: client.post(url, **kwargs), timeout_s, step_s=0.2,
                            accept=lambda r: r.status_code != 503,
                            what=lambda r: f"an answer other than 503 to POST {url}: {r.text}")


async def wait_until_found(bootstrap: str, topic: str, since_ms: int, match, timeout_s: float = 20) -> list:
    """`read_topic` again until something matches; what matched."""
    return await wait_until(lambda: read_topic(bootstrap, topic, since_ms, match), timeout_s, step_s=0.2,
                            what=f"a match on {topic}")


async def read_topic(bootstrap: str, topic: str, since_ms: int, match) -> list:
    """Decoded events on `topic` written since `since_ms` (epoch ms) for which match(event) holds."""
    from schemas.billing_periods import PeriodClosed
    from schemas.codec import DecodeError, decode
    from plumbing.kafka.clients import make_consumer, partitions_of

    consumer = make_consumer(bootstrap, client_id="test-read-topic", auto_offset_reset="latest")
    await consumer.start()
    found = []
    try:
        tps = await partitions_of(consumer, topic)
        consumer.assign(tps)
        starts = await consumer.offsets_for_times({tp: since_ms for tp in tps})
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            if starts[tp] is None:
                await consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, starts[tp].offset)
        pending = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
        while pending:
            for records in (await consumer.getmany(*pending, timeout_ms=500)).values():
                for record in records:
                    try:
                        event = decode(topic, record.value)
                    except DecodeError:
                        continue
                    if isinstance(event, PeriodClosed):
                        continue  # a billing period's marker: of no generation, in no test's match
                    if match(event):
                        found.append(event)
            pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    return found
