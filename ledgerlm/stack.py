"""`ledgerlm up` / `ledgerlm down`: the whole platform on this machine.

    up:   infra (Kafka + PostgreSQL) ─▶ migrations ─▶ topics ─▶ model ready + registered (stack_model)
          ─▶ demo tenant ─▶ controller, worker, projector, gateway processes ─▶ one demo generation
    down: stops the role processes `up` started (and the services, if `up` started them)

Role processes run in their own sessions with logs under `<home>/logs`; their
pids are kept in `<home>/stack.json`. The demo tenant's API key is kept in
`<home>/demo-tenant.json` (mode 0600): it is shown once by the tenant admin,
and a local stack needs it again on every `up`.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ledgerlm.settings import REPO_ROOT, Settings

ROLES = ("controller", "worker", "projector", "gateway")
DEMO_QUESTION = "What is the capital of France? Answer in one sentence."


@dataclass
class Stack:
    gateway: str
    api_key: str
    tenant_id: str
    model: str
    pids: dict[str, int] = field(default_factory=dict)
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


class StackRunner:
    def __init__(self, settings: Settings, model_spec: str = "smollm2-135m-instruct", log=print) -> None:
        self.settings = settings
        self.model_spec = model_spec
        self.log = log

    # -- preparation -------------------------------------------------------------------------
    def services(self) -> tuple[str, str, bool]:
        from consumers.kafka.topic_admin import TopicAdmin
        from infra.services import LocalServices
        from migrations import runner

        local = LocalServices(self.settings)
        before = local.status()
        was_up = before["kafka"]["up"] and before["postgres"]["up"]
        endpoints = local.up()
        runner.upgrade(endpoints.database_url)

        async def ensure():
            async with TopicAdmin(endpoints.kafka_bootstrap, self.settings.topic_partitions,
                                  self.settings.topic_replication_factor) as admin:
                return await admin.ensure()

        report = asyncio.run(ensure())
        if report.drift:
            raise RuntimeError(f"topics drifted from their declaration: {report.drift}")
        return endpoints.kafka_bootstrap, endpoints.database_url, not was_up

    def model(self, bootstrap: str) -> str:
        from ledgerlm.stack_model import prepare_model

        return prepare_model(self.settings, self.model_spec, bootstrap, self.log)

    def tenant(self, bootstrap: str, database_url: str) -> tuple[str, str]:
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
        created = asyncio.run(create_tenant(bootstrap, database_url, f"demo-{os.urandom(3).hex()}", TenantLimits()))
        path.write_text(json.dumps({"tenantId": created.tenant_id, "apiKey": created.api_key}))
        path.chmod(0o600)
        return created.tenant_id, created.api_key

    # -- processes -----------------------------------------------------------------------------
    def spawn(self, role: str, args: list[str], env: dict[str, str]) -> tuple[int, Path]:
        logs = self.settings.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"{role}.log"
        with path.open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "ledgerlm.cli.main", *args], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    cwd=REPO_ROOT)
        return proc.pid, path

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
        existing = read_stack(self.settings)
        if existing is not None and any(alive(p) for p in existing.pids.values()):
            return existing
        bootstrap, database_url, started = self.services()
        model = self.model(bootstrap)
        tenant_id, api_key = self.tenant(bootstrap, database_url)
        port = free_port(self.settings.gateway_port)
        env = {**os.environ, "LEDGERLM_KAFKA_BOOTSTRAP": bootstrap, "LEDGERLM_DATABASE_URL": database_url,
               "LEDGERLM_GATEWAY_PORT": str(port)}
        stack = Stack(gateway=f"http://127.0.0.1:{port}", api_key=api_key, tenant_id=tenant_id, model=model,
                      services_started=started)
        commands = {"controller": (["controller"], "controller owns partitions"),
                    "worker": (["worker", "--model-version", model, "--worker-id", "local-worker-1"],
                               "worker ready"),
                    "projector": (["project"], None),
                    "gateway": (["gateway"], None)}
        for role in ROLES:
            args, ready = commands[role]
            log_path = self.settings.home / "logs" / f"{role}.log"
            offset = log_path.stat().st_size if log_path.exists() else 0
            pid, path = self.spawn(role, args, env)
            stack.pids[role], stack.logs[role] = pid, str(path)
            write_stack(self.settings, stack)
            if ready:
                self.wait_for_log(path, ready, offset, pid, 120)
        self.wait_for_gateway(stack, 60)
        return stack

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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(stack), indent=2))
    path.chmod(0o600)


def down(settings: Settings, timeout_s: float = 20.0) -> dict[str, bool]:
    """Stop the role processes (gateway first, controller last); services only if `up` started them."""
    stack = read_stack(settings)
    if stack is None:
        return {}
    stopped = {}
    for role in reversed(ROLES):
        pid = stack.pids.get(role)
        if pid is None or not alive(pid):
            stopped[role] = False
            continue
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)
        stopped[role] = True
    if stack.services_started:
        from infra.services import LocalServices

        stopped.update(LocalServices(settings).down())
    stack_file(settings).unlink()
    return stopped
