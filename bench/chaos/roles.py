"""The platform's role processes for the chaos run, and the supervisor that restarts the ones that crash.

A real deployment runs each role under a supervisor (systemd, Kubernetes) that
restarts it when it exits; the chaos run does the same, and reports how often it
had to: a role that exits on a broker or database outage is restarted, never
hidden. Faults that kill a role on purpose take it out of supervision first.
"""
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

from plumbing.settings import REPO_ROOT


class Role:
    """One `ledgerlm <role>` process, its output appended to a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.args, self.env, self.log = name, args, env, log
        self.proc: subprocess.Popen | None = None
        self.supervised = True
        self.crash_restarts = 0

    def start(self) -> "Role":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "ledgerlm.cli.main", *self.args], env=self.env,
                                         cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        self.supervised = True
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    async def wait_for_log(self, fragment: str, timeout_s: float, after: int = 0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if fragment in self.log.read_text(errors="replace")[after:]:
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name}: no {fragment!r} within {timeout_s:.0f}s; "
                           f"log tail:\n{self.log.read_text(errors='replace')[-2000:]}")

    def kill9(self) -> None:
        """A crash: SIGKILL, no cleanup; out of supervision until started again."""
        self.supervised = False
        if self.running:
            self.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
            self.proc.wait(timeout=10)  # type: ignore[union-attr]

    def stop(self) -> None:
        self.terminate()
        self.wait_stopped()

    def terminate(self) -> None:
        self.supervised = False
        if self.running:
            self.proc.terminate()  # type: ignore[union-attr]

    def wait_stopped(self, timeout_s: float = 15) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stop_all(roles: list[Role]) -> None:
    """SIGTERM every role at once, then wait for each: shutdowns run side by side."""
    for role in roles:
        role.terminate()
    for role in roles:
        role.wait_stopped()


async def supervise(roles: dict[str, Role], stop: asyncio.Event, every_s: float = 0.5) -> None:
    """Restart every supervised role that exited, until `stop` is set (a fault may replace a role meanwhile)."""
    while not stop.is_set():
        for role in list(roles.values()):
            if role.supervised and role.proc is not None and not role.running:
                role.crash_restarts += 1
                role.start()
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass
