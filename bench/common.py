"""Helpers every benchmark shares: percentiles, spawning `ledgerlm` roles, waiting for their logs, free ports."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from infra.ports import listen_port
from plumbing.settings import REPO_ROOT


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A `ledgerlm` subcommand in a process of its own, stdout and stderr written to `log` (emptied first: a
    previous run's lines must not satisfy `wait_for_log`)."""
    return subprocess.Popen([sys.executable, "-m", "ledgerlm.cli.main", *args], env=env, cwd=REPO_ROOT,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


async def wait_for_log(log: Path, fragment: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fragment in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{log.stem}: no {fragment!r}: {log.read_text(errors='replace')[-2000:]}")


async def wait_ready(http, proc: subprocess.Popen, log: Path, timeout_s: float = 60, path: str = "/healthz") -> None:
    """Poll GET `path` on an httpx client until 200, failing early (with the log's tail) when `proc` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if (await http.get(path)).status_code == 200:
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{log.stem} did not come up: {log.read_text(errors='replace')[-2000:]}")


def free_port() -> int:
    """A port for a process to listen on (outside the ephemeral range: see infra.ports)."""
    return listen_port()


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 20) -> None:
    """SIGTERM each process we started, then SIGKILL whichever has not exited within `timeout_s`."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def local_endpoints(settings) -> tuple[str, str]:
    """(Kafka bootstrap, database URL) of the stack `ledgerlm infra up` started (or the environment names)."""
    from infra.services import LocalServices

    endpoints = LocalServices(settings).endpoints()
    if not endpoints.kafka_bootstrap or not endpoints.database_url:
        raise RuntimeError("no Kafka or PostgreSQL: run `ledgerlm infra up` (or set LEDGERLM_KAFKA_BOOTSTRAP and "
                           "LEDGERLM_DATABASE_URL) before this benchmark")
    return endpoints.kafka_bootstrap, endpoints.database_url
