"""Background processes that outlive the CLI call that started them."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start argv detached (own session) with output appended to log_path; returns the pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, **(env or {})},
        )
    return proc.pid


def is_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this very process still answers kill(0); reap it.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def terminate(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group, then SIGKILL after timeout_s."""
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not is_alive(pid):
                return
            time.sleep(0.1)


def kill_group(pid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL the process group (a crash, not a shutdown) and wait until it is gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
