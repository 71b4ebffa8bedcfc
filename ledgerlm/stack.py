"""`ledgerlm up` / `ledgerlm down`: the whole platform on this machine.

    up:   infra (Kafka + PostgreSQL) ─▶ migrations ─▶ topics ─▶ model ready + registered (stack_model)
          ─▶ demo tenant ─▶ controller, worker, projector, gateway, intake (+ results publisher) processes
          ─▶ one demo generation
    down: stops the role processes `up` started (and the services, if `up` started them)

Role processes run in their own sessions with logs under `<home>/logs`; their
pids, and each one's start time (/proc/<pid>/stat field 22), are kept in
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
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from plumbing.secrets import write_secret_file
from plumbing.settings import REPO_ROOT, Settings

if TYPE_CHECKING:
    from plumbing.kafka.access import KafkaAccess

ROLES = ("controller", "worker", "projector", "gateway", "intake")  # started in this order, stopped in reverse
DEMO_QUESTION = "What is the capital of France? Answer in one sentence."
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class StackStopped(BaseException):
    """SIGTERM or SIGHUP reached `ledgerlm up` (a BaseException, like Ctrl-C's KeyboardInterrupt, so no
    `except Exception` on the way swallows it)."""


@dataclass
class Stack:
    gateway: str
    api_key: str
    tenant_id: str
    model: str
    pids: dict[str, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)  # role -> its process's start time (clock ticks)
    logs: dict[str, str] = field(default_factory=dict)
    services_started: bool = False

    def summary(self) -> dict:
        return {"gateway": self.gateway, "apiKey": self.api_key, "model": self.model, "pids": self.pids,
                "tenantId": self.tenant_id, "logs": self.logs}


def stack_file(settings: Settings) -> Path:
    return settings.home / "stack.json"


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError("no free port")


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
                 intake: bool = True) -> None:
        self.settings = settings
        self.model_spec = model_spec
        self.log = log
        self.roles = ROLES if intake else tuple(r for r in ROLES if r != "intake")

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
    def spawn(self, stack: Stack, role: str, args: list[str], env: dict[str, str]) -> Path:
        """Start one role in its own session and record it in the state file before anything else can
        happen: the stop signals wait until it is recorded, so whatever stops `up` stops this role too."""
        logs = self.settings.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"{role}.log"
        with signals_deferred():
            with path.open("ab") as out:
                proc = subprocess.Popen([sys.executable, "-m", "ledgerlm.cli.main", *args], env=env, stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                        cwd=REPO_ROOT)
            stack.pids[role], stack.logs[role] = proc.pid, str(path)
            stack.starts[role] = process_start(proc.pid)
            write_stack(self.settings, stack)
        return path

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
        port = free_port(self.settings.gateway_port)
        env = {**os.environ, "LEDGERLM_KAFKA_BOOTSTRAP": kafka.bootstrap, "LEDGERLM_DATABASE_URL": database_url,
               "LEDGERLM_GATEWAY_PORT": str(port)}
        stack = Stack(gateway=f"http://127.0.0.1:{port}", api_key=api_key, tenant_id=tenant_id, model=model,
                      services_started=started)
        commands = {"controller": (["controller"], "controller owns partitions"),
                    "worker": (["worker", "--model-version", model, "--worker-id", "local-worker-1"],
                               "worker ready"),
                    "projector": (["project"], None),
                    "gateway": (["gateway"], None),
                    "intake": (["intake"], "intake started")}
        for role in self.roles:
            args, ready = commands[role]
            log_path = self.settings.home / "logs" / f"{role}.log"
            offset = log_path.stat().st_size if log_path.exists() else 0
            path = self.spawn(stack, role, args, self.env_of(role, env, kafka))
            if ready:
                self.wait_for_log(path, ready, offset, stack.pids[role], 120)
        self.wait_for_gateway(stack, 60)
        return stack

    def env_of(self, role: str, env: dict[str, str], kafka: "KafkaAccess") -> dict[str, str]:
        """The intake (and its results publisher) works on tenants' topics, which PLAINTEXT's ANONYMOUS may not
        touch once the broker has ACLs: it logs in to the SASL listener as the gateway principal."""
        if role != "intake":
            return role_env(env, kafka, role)
        if kafka.uses_sasl:
            return role_env(env, kafka, "gateway")
        from infra.services import LocalServices

        return {**env, **LocalServices(self.settings).principal_env("gateway")}

    @staticmethod
    def wait_for_gateway(stack: Stack, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{stack.gateway}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"gateway at {stack.gateway} did not answer /healthz")


def role_env(env: dict[str, str], access: "KafkaAccess", role: str) -> dict[str, str]:
    """A role's environment: over SASL it authenticates as its own principal (a local broker's password is
    looked up by that name, see LocalServices.kafka_access)."""
    if not access.uses_sasl:
        return env
    return {**env, "LEDGERLM_KAFKA_SECURITY_PROTOCOL": access.protocol, "LEDGERLM_KAFKA_SASL_USERNAME": role}


def demo_generation(stack: Stack, write=None, attempts: int = 20) -> dict:
    """Stream one chat generation through the stack; `write(text)` receives each delta. Returns the final event."""
    import httpx

    body = {"requestId": f"demo-{os.urandom(6).hex()}", "model": stack.model, "stream": True,
            "messages": [{"role": "user", "content": DEMO_QUESTION}], "maxOutputTokens": 48}
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    for _ in range(attempts):  # the worker's first heartbeat may not have reached the controller yet
        with httpx.stream("POST", f"{stack.gateway}/v1/generations", json=body, headers=headers,
                          timeout=60) as response:
            if response.status_code == 503:
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
    raise RuntimeError("no worker became ready for the demo generation")


def read_stack(settings: Settings) -> Stack | None:
    path = stack_file(settings)
    if not path.is_file():
        return None
    return Stack(**json.loads(path.read_text()))


def write_stack(settings: Settings, stack: Stack) -> None:
    path = stack_file(settings)
    write_secret_file(path, json.dumps(asdict(stack), indent=2))


def down(settings: Settings, timeout_s: float = 20.0) -> dict[str, bool]:
    """Stop the role processes (gateway first, controller last); services only if `up` started them.

    A recorded pid is signalled only while it is still the process `up` started (`is_ours`)."""
    stack = read_stack(settings)
    if stack is None:
        return {}
    stopped = {}
    for role in reversed(ROLES):
        pid, start = stack.pids.get(role), stack.starts.get(role)
        if pid is None or not is_ours(pid, start):
            stopped[role] = False
            continue
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            if is_ours(pid, start):
                os.killpg(pid, sig)  # its session: the role and anything it started
            deadline = time.monotonic() + wait_s
            while is_ours(pid, start) and time.monotonic() < deadline:  # (reaps it when it is our child)
                time.sleep(0.1)
        stopped[role] = True
    if stack.services_started:
        from infra.services import LocalServices

        stopped.update(LocalServices(settings).down())
    stack_file(settings).unlink(missing_ok=True)
    return stopped
