"""`ledgerlm up` / `ledgerlm down`: the whole platform on this machine.

    up:   infra (Kafka + PostgreSQL) ─▶ migrations ─▶ topics ─▶ model ready + registered (stack_model)
          ─▶ demo tenant ─▶ N controllers, workers, projectors, gateways, intakes (+ results publisher)
          (stack_roles) ─▶ one demo generation
    down: stops the role processes `up` started (and the services, if `up` started them)

Role processes (named `<role>-<i>`, ports in stack_roles.py) run in their own
sessions with logs under `<home>/logs/<role>-<i>.log`; their pids, ports, and
each one's start time (/proc/<pid>/stat field 22), are kept in
`<home>/stack.json` from the moment each is spawned. A pid alone may name
another process once ours has exited, so `down` signals a pid only while its
start time is still the one recorded. `up` that fails part way, or is stopped
by SIGTERM, SIGHUP or Ctrl-C, stops whatever it had started (up_cmd.py).

The demo tenant's API key is kept in `<home>/demo-tenant.json`: it is shown
once by the tenant admin, and a local stack needs it again on every `up`. That
file and `stack.json` (which repeats the key) are created with mode 0600.

With `LEDGERLM_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT` the roles reach the
local broker's SASL listener, each as its own principal (the role's name);
their passwords stay in the broker's credentials file, never in the environment.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ledgerlm.stack_roles import PortPicker, RoleCounts, RoleProcess, kind_of, plan_roles, stop_order
from plumbing.secrets import write_secret_file
from plumbing.settings import REPO_ROOT, Settings

if TYPE_CHECKING:
    from plumbing.kafka.access import KafkaAccess

DEMO_QUESTION = "What is the capital of France? Answer in one sentence."
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class StackStopped(BaseException):
    """SIGTERM or SIGHUP reached `ledgerlm up` (a BaseException, like Ctrl-C's KeyboardInterrupt, so no
    `except Exception` on the way swallows it)."""


@dataclass
class Stack:
    gateway: str  # the first gateway's URL
    api_key: str
    tenant_id: str
    model: str
    pids: dict[str, int] = field(default_factory=dict)  # "gateway-2" -> pid
    starts: dict[str, int] = field(default_factory=dict)  # name -> its process's start time (clock ticks)
    logs: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # name -> HTTP port (gateways) or metrics port
    gateways: list[str] = field(default_factory=list)  # every gateway's URL
    services_started: bool = False

    def summary(self) -> dict:
        return {"gateway": self.gateway, "gateways": self.gateways, "apiKey": self.api_key, "model": self.model,
                "pids": self.pids, "ports": self.ports, "tenantId": self.tenant_id, "logs": self.logs}


def stack_file(settings: Settings) -> Path:
    return settings.home / "stack.json"


def alive(pid: int) -> bool:
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child that exited: reap it
            return False
    except ChildProcessError:
        pass  # not our child (a detached `up` started it): signal 0 tells
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Stop signals that arrive inside the block are delivered when it ends. (Not by blocking them: a
    process started inside would inherit the blocked mask and never see SIGTERM.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; nothing to defer elsewhere
        return
    pending: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: pending.append(signum)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            os.kill(os.getpid(), pending[0])  # to the handlers in place again


def process_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (/proc/<pid>/stat field 22), None if there is
    no such process. With the pid it names one process: a pid is reused once its process has exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])  # fields after "(comm)" start at field 3


def is_ours(pid: int, start: int | None) -> bool:
    """The process `up` started is still running: alive, and started when it was recorded to have started."""
    return start is not None and alive(pid) and process_start(pid) == start


class StackRunner:
    def __init__(self, settings: Settings, model_spec: str = "smollm2-135m-instruct", log=print,
                 counts: RoleCounts = RoleCounts()) -> None:
        self.settings = settings
        self.model_spec = model_spec
        self.log = log
        self.counts = counts

    # -- preparation -------------------------------------------------------------------------
    def services(self) -> tuple["KafkaAccess", str, bool]:
        from plumbing.kafka.topic_admin import TopicAdmin
        from infra.services import LocalServices
        from migrations import runner

        local = LocalServices(self.settings)
        before = local.status()
        was_up = before["kafka"]["up"] and before["postgres"]["up"]
        # Recorded before starting them, so a failure or a signal from here on stops them again.
        write_stack(self.settings, Stack(gateway="", api_key="", tenant_id="", model="", services_started=not was_up))
        endpoints = local.up()
        access = local.kafka_access()
        runner.upgrade(endpoints.database_url)

        async def ensure():
            async with TopicAdmin(access, self.settings.topic_partitions,
                                  self.settings.topic_replication_factor) as admin:
                return await admin.ensure()

        report = asyncio.run(ensure())
        if report.drift:
            raise RuntimeError(f"topics drifted from their declaration: {report.drift}")
        return access, endpoints.database_url, not was_up

    def model(self, kafka: "KafkaAccess") -> str:
        from ledgerlm.stack_model import prepare_model

        return prepare_model(self.settings, self.model_spec, kafka, self.log)

    def tenant(self, kafka: "KafkaAccess", database_url: str) -> tuple[str, str]:
        import psycopg

        from producers.api_keys import authenticate
        from producers.tenant_admin import create_tenant
        from schemas.values import TenantLimits

        path = self.settings.home / "demo-tenant.json"
        if path.is_file():
            saved = json.loads(path.read_text())
            with psycopg.connect(database_url) as conn:
                if authenticate(conn, saved["apiKey"]) == saved["tenantId"]:
                    return saved["tenantId"], saved["apiKey"]
        created = asyncio.run(create_tenant(kafka, database_url, f"demo-{os.urandom(3).hex()}", TenantLimits()))
        write_secret_file(path, json.dumps({"tenantId": created.tenant_id, "apiKey": created.api_key}))
        return created.tenant_id, created.api_key

    # -- processes -----------------------------------------------------------------------------
    def spawn(self, stack: Stack, role: RoleProcess, env: dict[str, str]) -> tuple[Path, int]:
        """Start one role in its own session and record it in the state file before anything else can
        happen: the stop signals wait until it is recorded, so whatever stops `up` stops this role too.
        Returns its log and where in it this run's output begins."""
        logs = self.settings.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"{role.name}.log"
        offset = path.stat().st_size if path.exists() else 0
        with signals_deferred():
            with path.open("ab") as out:
                proc = subprocess.Popen([sys.executable, "-m", "ledgerlm.cli.main", *role.args],
                                        env={**env, **role.env}, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO_ROOT)
            stack.pids[role.name], stack.logs[role.name] = proc.pid, str(path)
            stack.starts[role.name] = process_start(proc.pid)
            stack.ports[role.name] = role.port
            write_stack(self.settings, stack)
        return path, offset

    @staticmethod
    def wait_for_log(path: Path, fragment: str, offset: int, pid: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if fragment in path.read_text(errors="replace")[offset:]:
                return
            if not alive(pid):
                break
            time.sleep(0.2)
        tail = path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{path.stem} did not report {fragment!r} (see {path}):\n{tail}")

    def up(self) -> Stack:
        """Start everything, or return the stack a previous `up` runs. On any failure part way (or a stop
        signal, raised as StackStopped), the caller stops what was started with `down`."""
        existing = read_stack(self.settings)
        if existing is not None and any(is_ours(pid, existing.starts.get(role)) for role, pid in existing.pids.items()):
            return existing
        kafka, database_url, started = self.services()
        model = self.model(kafka)
        tenant_id, api_key = self.tenant(kafka, database_url)
        roles = plan_roles(self.settings, self.counts, model, PortPicker())
        env = {**os.environ, "LEDGERLM_KAFKA_BOOTSTRAP": kafka.bootstrap, "LEDGERLM_DATABASE_URL": database_url}
        gateways = [f"http://127.0.0.1:{role.port}" for role in roles if role.kind == "gateway"]
        stack = Stack(gateway=gateways[0], gateways=gateways, api_key=api_key, tenant_id=tenant_id, model=model,
                      services_started=started)
        for kind in dict.fromkeys(role.kind for role in roles):  # every instance of a kind starts side by side
            spawned = [(role, *self.spawn(stack, role, self.env_of(kind, env, kafka))) for role in roles
                       if role.kind == kind]
            for role, path, offset in spawned:
                if role.ready_log:
                    self.wait_for_log(path, role.ready_log, offset, stack.pids[role.name], 120)
        for url in gateways:
            self.wait_for_gateway(url, 60)
        return stack

    def env_of(self, kind: str, env: dict[str, str], kafka: "KafkaAccess") -> dict[str, str]:
        """The intake (and its results publisher) works on tenants' topics, which PLAINTEXT's ANONYMOUS may not
        touch once the broker has ACLs: it logs in to the SASL listener as the gateway principal."""
        if kind == "export":  # a reader of llm.generations, like the projector: its principal
            return role_env(env, kafka, "projector")
        if kind != "intake":
            return role_env(env, kafka, kind)
        if kafka.uses_sasl:
            return role_env(env, kafka, "gateway")
        from infra.services import LocalServices

        return {**env, **LocalServices(self.settings).principal_env("gateway")}

    @staticmethod
    def wait_for_gateway(url: str, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"gateway at {url} did not answer /healthz")


def role_env(env: dict[str, str], access: "KafkaAccess", role: str) -> dict[str, str]:
    """A role's environment: over SASL it authenticates as its own principal (a local broker's password is
    looked up by that name, see LocalServices.kafka_access)."""
    if not access.uses_sasl:
        return env
    return {**env, "LEDGERLM_KAFKA_SECURITY_PROTOCOL": access.protocol, "LEDGERLM_KAFKA_SASL_USERNAME": role}


def demo_generation(stack: Stack, write=None, timeout_s: float = 60.0) -> dict:
    """Stream one chat generation through the stack; `write(text)` receives each delta. Returns the final event."""
    import httpx

    body = {"requestId": f"demo-{os.urandom(6).hex()}", "model": stack.model, "stream": True,
            "messages": [{"role": "user", "content": DEMO_QUESTION}], "maxOutputTokens": 48}
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    deadline, refusal = time.monotonic() + timeout_s, ""
    # Until the workers' first heartbeats reach the controllers (and, with several controllers, their
    # partitions are settled), the answer is 503 with a Retry-After.
    while time.monotonic() < deadline:
        with httpx.stream("POST", f"{stack.gateway}/v1/generations", json=body, headers=headers,
                          timeout=60) as response:
            if response.status_code == 503:
                refusal = response.read().decode()
                time.sleep(0.5)
                continue
            if response.status_code not in (200, 201):
                raise RuntimeError(f"demo generation refused: {response.status_code} {response.read().decode()}")
            event = None
            for line in response.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    if event == "token" and write is not None:
                        write(data["text"])
                    elif event == "final":
                        return data
            raise RuntimeError("demo stream ended without a final event")
    raise RuntimeError(f"no worker became ready for the demo generation in {timeout_s:.0f}s (last 503: {refusal})")


def read_stack(settings: Settings) -> Stack | None:
    path = stack_file(settings)
    if not path.is_file():
        return None
    return Stack(**json.loads(path.read_text()))


def write_stack(settings: Settings, stack: Stack) -> None:
    path = stack_file(settings)
    write_secret_file(path, json.dumps(asdict(stack), indent=2))


def stop_processes(processes: list[tuple[int, int | None]], timeout_s: float) -> None:
    """SIGTERM each (pid, start) process's session, SIGKILL what is still running after `timeout_s`."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        for pid, start in processes:
            if is_ours(pid, start):
                os.killpg(pid, sig)  # its session: the role and anything it started
        deadline = time.monotonic() + wait_s
        while any(is_ours(pid, start) for pid, start in processes) and time.monotonic() < deadline:
            time.sleep(0.1)  # (is_ours reaps a process that is our child)


def down(settings: Settings, timeout_s: float = 20.0) -> dict[str, bool]:
    """Stop the role processes (gateways first, controllers last); services only if `up` started them.

    A recorded pid is signalled only while it is still the process `up` started (`is_ours`)."""
    stack = read_stack(settings)
    if stack is None:
        return {}
    stopped: dict[str, bool] = {}
    names = stop_order(list(stack.pids))
    for kind in dict.fromkeys(kind_of(name) for name in names):  # every instance of a kind at once
        ours = [name for name in names if kind_of(name) == kind and is_ours(stack.pids[name], stack.starts.get(name))]
        stopped.update({name: name in ours for name in names if kind_of(name) == kind})
        stop_processes([(stack.pids[name], stack.starts.get(name)) for name in ours], timeout_s)
    if stack.services_started:
        from infra.services import LocalServices

        stopped.update(LocalServices(settings).down())
    stack_file(settings).unlink(missing_ok=True)
    return stopped
