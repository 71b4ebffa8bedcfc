"""`ledgerlm up` / `down` as an operator runs them (issue 15, finding 7): a real `up` process on the session's
Kafka and a database of its own, stopped by a signal or by a failure part way; `down` and reused pids."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from plumbing.settings import Settings
from ledgerlm.stack import Stack, alive, read_stack, stack_file, write_stack


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture
def up_env(services, scratch_database, tmp_path) -> dict[str, str]:
    """`ledgerlm up` on the session's broker, an empty database, a home, groups and a port of its own."""
    from engine.demo_model import build_demo_model

    home = tmp_path / "home"
    build_demo_model(home / "models" / "demo-tiny", size="tiny", train_steps=0, progress=False)  # reused by `up`
    tag = uuid.uuid4().hex[:8]
    return {**os.environ, "LEDGERLM_HOME": str(home), "LEDGERLM_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
            "LEDGERLM_DATABASE_URL": scratch_database, "LEDGERLM_CONTROLLER_GROUP": f"up-controller-{tag}",
            "LEDGERLM_PROJECTOR_GROUP": f"up-projector-{tag}", "LEDGERLM_GATEWAY_PORT": str(free_port()),
            "LEDGERLM_WORKER_DEVICE": "cpu", "LEDGERLM_WORKER_KV_CACHE_BYTES": str(64 * 16 * 512)}


def start_up(env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ledgerlm.cli.main", "up", "--model", "demo-tiny"], env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_for(predicate, timeout_s: float, what: str, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)  # the poll interval of this wait on a condition
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}:\n{log.read_text()[-3000:]}")


def test_up_stopped_by_sigterm_stops_every_role_frees_the_port_and_removes_its_state(up_env, tmp_path):
    settings = Settings(home=Path(up_env["LEDGERLM_HOME"]))
    log = tmp_path / "up.log"
    up = start_up(up_env, log)
    try:
        wait_for(lambda: "serving; Ctrl-C stops everything" in log.read_text(), 240, "the stack to serve", log)
        stack = read_stack(settings)
        assert set(stack.pids) == {"controller", "worker", "projector", "gateway", "intake"}
        assert not port_is_free(int(up_env["LEDGERLM_GATEWAY_PORT"]))
        up.send_signal(signal.SIGTERM)  # what `timeout`, systemd or a closed terminal (SIGHUP) sends
        assert up.wait(timeout=90) == 0
    finally:
        if up.poll() is None:
            up.kill()
    assert [role for role, pid in stack.pids.items() if alive(pid)] == []
    assert not stack_file(settings).exists() and port_is_free(int(up_env["LEDGERLM_GATEWAY_PORT"]))


def test_up_that_fails_part_way_stops_the_roles_it_had_started(up_env, tmp_path):
    settings = Settings(home=Path(up_env["LEDGERLM_HOME"]))
    log = tmp_path / "up.log"
    # A pool too small for one request: the worker refuses to start, after the controller has started.
    up = start_up({**up_env, "LEDGERLM_WORKER_KV_CACHE_BYTES": "1024"}, log)
    started: dict[str, int] = {}

    def controller_running() -> bool:
        stack = read_stack(settings)
        if stack is not None and "controller" in stack.pids:
            started.update(stack.pids)
        return "controller" in started

    try:
        wait_for(controller_running, 240, "the controller to start", log)
        assert up.wait(timeout=240) == 2  # a CliError naming the worker's failure
    finally:
        if up.poll() is None:
            up.kill()
    assert "worker did not report 'worker ready'" in log.read_text()
    assert [role for role, pid in started.items() if alive(pid)] == []
    assert not stack_file(settings).exists()


def test_down_signals_no_process_that_merely_reuses_a_recorded_pid(tmp_path):
    from ledgerlm.stack import down, process_start

    settings = Settings(home=tmp_path)
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        start = process_start(bystander.pid)
        # The recorded gateway exited long ago; the kernel gave its pid to this other process since.
        write_stack(settings, Stack(gateway="", api_key="", tenant_id="", model="",
                                    pids={"gateway": bystander.pid}, starts={"gateway": start - 1}))
        assert down(settings)["gateway"] is False
        assert bystander.poll() is None and not stack_file(settings).exists()
        write_stack(settings, Stack(gateway="", api_key="", tenant_id="", model="",
                                    pids={"gateway": bystander.pid}, starts={"gateway": start}))
        assert down(settings)["gateway"] is True
        assert not alive(bystander.pid)  # (down reaped it: it is this test's child)
    finally:
        if bystander.poll() is None:
            bystander.kill()
