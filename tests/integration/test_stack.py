"""`ledgerlm up` / `down` as an operator runs them (issue 15, finding 7): a real `up` process on the session's
Kafka and a database of its own, stopped by a signal or by a failure part way; `down` and reused pids."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ledgerlm.stack import Stack, alive, demo_generation, read_stack, stack_file, write_stack
from infra.ports import listen_port as free_port
from ledgerlm.stack_roles import port_is_free
from plumbing.settings import Settings
from tests.waiting import wait_until_sync


@pytest.fixture
def up_env(services, scratch_database, tmp_path) -> dict[str, str]:
    """`ledgerlm up` on the session's broker, an empty database, a home, groups and a port of its own."""
    from engine.artifacts.demo_model import build_demo_model

    home = tmp_path / "home"
    build_demo_model(home / "models" / "demo-tiny", size="tiny", train_steps=0, progress=False)  # reused by `up`
    tag = uuid.uuid4().hex[:8]
    return {**os.environ, "LEDGERLM_HOME": str(home), "LEDGERLM_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
            "LEDGERLM_DATABASE_URL": scratch_database, "LEDGERLM_CONTROLLER_GROUP": f"up-controller-{tag}",
            "LEDGERLM_PROJECTOR_GROUP": f"up-projector-{tag}", "LEDGERLM_GATEWAY_GROUP": f"up-gateways-{tag}",
            "LEDGERLM_GATEWAY_PORT": str(free_port()),
            "LEDGERLM_WORKER_DEVICE": "cpu", "LEDGERLM_WORKER_KV_CACHE_BYTES": str(64 * 16 * 512)}


def start_up(env: dict[str, str], log: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ledgerlm.cli.main", "up", "--model", "demo-tiny", *options],
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_for(predicate, timeout_s: float, what: str, log: Path):
    """`wait_until_sync`, the stack's log tail in its message."""
    return wait_until_sync(predicate, timeout_s, step_s=0.2, what=lambda _: f"{what}:\n{log.read_text()[-3000:]}")


def last_owned_partitions(log: Path) -> set[int]:
    """The llm.commands partitions a controller's log says it owns now ("controller owns partitions=[0, 1]")."""
    lines = [line for line in log.read_text().splitlines() if "controller owns partitions=[" in line]
    listed = lines[-1].split("partitions=[", 1)[1].split("]", 1)[0] if lines else ""
    return {int(p) for p in listed.split(",") if p.strip()}


def test_up_with_two_of_each_role_serves_on_both_gateways_and_sigterm_stops_them_all_and_frees_the_ports(
        up_env, tmp_path):
    settings = Settings(home=Path(up_env["LEDGERLM_HOME"]))
    log = tmp_path / "up.log"
    up = start_up(up_env, log, "--gateways", "2", "--workers", "2", "--controllers", "2", "--projectors", "2")
    try:
        wait_for(lambda: "serving; Ctrl-C stops the roles" in log.read_text(), 300, "the stack to serve", log)
        stack = read_stack(settings)
        names = {f"{kind}-{i}" for kind in ("controller", "worker", "projector", "gateway") for i in (1, 2)}
        assert set(stack.pids) == set(stack.ports) == names | {"intake-1"}
        assert len(set(stack.ports.values())) == 9 and stack.ports["gateway-1"] == int(up_env["LEDGERLM_GATEWAY_PORT"])
        assert stack.gateways == [f"http://127.0.0.1:{stack.ports[f'gateway-{i}']}" for i in (1, 2)]
        assert [port for port in stack.ports.values() if port_is_free(port)] == []  # every role listens
        # The second gateway serves a generation too (the first one served `up`'s demo question).
        final = demo_generation(dataclasses.replace(stack, gateway=stack.gateways[1]))
        assert final["reason"] in ("completed", "output-limit") and final["usage"]["outputTokens"] > 0
        owned = [last_owned_partitions(Path(stack.logs[f"controller-{i}"])) for i in (1, 2)]
        assert owned[0] and owned[1] and owned[0].isdisjoint(owned[1])
        assert owned[0] | owned[1] == set(range(settings.topic_partitions))  # the two split llm.commands
        up.send_signal(signal.SIGTERM)  # what `timeout`, systemd or a closed terminal (SIGHUP) sends
        assert up.wait(timeout=120) == 0
    finally:
        if up.poll() is None:
            up.kill()
    assert [role for role, pid in stack.pids.items() if alive(pid)] == []
    assert not stack_file(settings).exists()
    assert [port for port in stack.ports.values() if not port_is_free(port)] == []


def test_up_that_fails_part_way_stops_the_roles_it_had_started(up_env, tmp_path):
    settings = Settings(home=Path(up_env["LEDGERLM_HOME"]))
    log = tmp_path / "up.log"
    # A pool too small for one request: the worker refuses to start, after the controller has started.
    up = start_up({**up_env, "LEDGERLM_WORKER_KV_CACHE_BYTES": "1024"}, log)
    started: dict[str, int] = {}

    def controller_running() -> bool:
        stack = read_stack(settings)
        if stack is not None and "controller-1" in stack.pids:
            started.update(stack.pids)
        return "controller-1" in started

    try:
        wait_for(controller_running, 240, "the controller to start", log)
        assert up.wait(timeout=240) == 2  # a CliError naming the worker's failure
    finally:
        if up.poll() is None:
            up.kill()
    assert "worker-1 did not report 'worker ready'" in log.read_text()
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
                                    pids={"gateway-1": bystander.pid}, starts={"gateway-1": start - 1}))
        assert down(settings)["gateway-1"] is False
        assert bystander.poll() is None and not stack_file(settings).exists()
        write_stack(settings, Stack(gateway="", api_key="", tenant_id="", model="",
                                    pids={"gateway-1": bystander.pid}, starts={"gateway-1": start}))
        assert down(settings)["gateway-1"] is True
        assert not alive(bystander.pid)  # (down reaped it: it is this test's child)
    finally:
        if bystander.poll() is None:
            bystander.kill()


def test_up_with_export_kafka_runs_an_exporter_that_exports_the_demo_generations_seal(up_env, tmp_path):
    import psycopg

    settings = Settings(home=Path(up_env["LEDGERLM_HOME"]))
    log = tmp_path / "up.log"
    env = {**up_env, "LEDGERLM_EXPORT_GROUP": f"up-export-{uuid.uuid4().hex[:8]}"}
    up = start_up(env, log, "--no-intake", "--export", "kafka")
    try:
        wait_for(lambda: "serving; Ctrl-C stops the roles" in log.read_text(), 300, "the stack to serve", log)
        stack = read_stack(settings)
        assert set(stack.pids) == {"controller-1", "worker-1", "projector-1", "gateway-1", "export-kafka"}
        assert not port_is_free(stack.ports["export-kafka"])  # its /metrics listens

        def exported() -> list[tuple]:
            with psycopg.connect(up_env["LEDGERLM_DATABASE_URL"]) as conn:
                return conn.execute("SELECT e.outcome FROM export_ledger e JOIN billing_ledger b USING "
                                    "(generation_id) WHERE e.sink = 'kafka' AND b.tenant_id = %s",
                                    (stack.tenant_id,)).fetchall()

        # The demo question `up` answered is sealed, and the exporter has put its seal on llm.usage-export.
        assert wait_until_sync(exported, 120, step_s=0.3, what=lambda _: f"the demo seal exported:\n"
                               f"{Path(stack.logs['export-kafka']).read_text()[-2000:]}") == [("acknowledged",)]
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=120) == 0
    finally:
        if up.poll() is None:
            up.kill()
    assert [role for role, pid in stack.pids.items() if alive(pid)] == []
