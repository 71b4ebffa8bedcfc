"""The chaos run's role processes (one, or N of each) and the faults run against them, in order.

    instances 1   controller, worker, projector, gateway (the names of the single-instance report)
    instances N   controller-1..N, worker-1..N, projector-1..N, gateway-1..N, each gateway on its own port;
                  controllers share one consumer group (they split llm.commands), projectors another

With replicas the run also kills -9 one gateway and one controller; a worker or projector kill hits the
first of its kind, so its replica carries the load meanwhile. A run whose faults include `exporter_kill9`
also runs one exporter (`ledgerlm export --sink openmeter`, to the run's receiver: bench/chaos/export.py).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from bench.chaos import export, faults, load_faults
from bench.chaos.roles import Role
from infra.ports import free_port

SINGLE_FAULTS = ("worker_kill9", "broker_kill9", "postgres_restart", "projector_kill9",
                 "projections_dropped_and_rebuilt", "usage_duplicates_and_late", "exporter_kill9")
REPLICA_FAULTS = ("gateway_kill9", "controller_kill9", "worker_kill9", "projector_kill9", "broker_kill9",
                  "postgres_restart", "projections_dropped_and_rebuilt", "usage_duplicates_and_late",
                  "exporter_kill9")
NEEDS_REPLICAS = {"gateway_kill9", "controller_kill9"}  # the only gateway or controller down is an outage
# Faults that look like load (bench/chaos/load_faults.py): run when named in --faults, not by default.
LOAD_FAULTS = load_faults.LOAD_FAULTS


@dataclass
class Fleet:
    roles: dict[str, Role]  # instance name -> its process
    gateway_ports: list[int]
    new_worker: Callable[[], Role]  # a worker with a fresh id (and log), not started

    def named(self, kind: str) -> list[str]:
        return [name for name, role in self.roles.items() if role.name == kind]


def faults_for(instances: int, chosen: tuple[str, ...] | None) -> tuple[str, ...]:
    """The faults of a run: `chosen` (checked), else every fault the instance count allows."""
    known = REPLICA_FAULTS if instances > 1 else SINGLE_FAULTS
    if chosen is None:
        return known
    unknown = [f for f in chosen if f not in REPLICA_FAULTS + LOAD_FAULTS]
    if unknown:
        raise ValueError(f"unknown faults {unknown}; known: {', '.join(REPLICA_FAULTS + LOAD_FAULTS)}")
    if instances == 1 and NEEDS_REPLICAS & set(chosen):
        raise ValueError(f"{sorted(NEEDS_REPLICAS & set(chosen))} need --instances 2 or more")
    return chosen


def build_fleet(instances: int, model: str, plane: str, env: dict[str, str], logs: Path,
                exporter_env: dict[str, str] | None = None) -> Fleet:
    """`exporter_env` (with the sink's address): the run has an exporter too."""
    numbers = iter(range(1, 1000))

    def name(kind: str, i: int) -> str:
        return kind if instances == 1 else f"{kind}-{i}"

    def new_worker() -> Role:
        n = next(numbers)
        return Role("worker", ["worker", "--model-version", model, "--worker-id", f"{plane}-w{n}"], env,
                    logs / f"worker-w{n}.log")

    roles: dict[str, Role] = {}
    for i in range(1, instances + 1):
        roles[name("controller", i)] = Role("controller", ["controller"], env, logs / f"{name('controller', i)}.log")
    for i in range(1, instances + 1):
        roles[name("worker", i)] = new_worker()
    for i in range(1, instances + 1):
        roles[name("projector", i)] = Role("projector", ["project"], env, logs / f"{name('projector', i)}.log")
    ports = []
    for i in range(1, instances + 1):
        ports.append(free_port(0))
        roles[name("gateway", i)] = Role("gateway", ["gateway", "--host", "127.0.0.1", "--port", str(ports[-1])],
                                         env, logs / f"{name('gateway', i)}.log")
    if exporter_env is not None:
        roles[export.EXPORTER] = Role("exporter", ["export", "--sink", export.SINK], exporter_env,
                                      logs / "exporter.log")
    return Fleet(roles, ports, new_worker)


async def wait_started(fleet: Fleet, timeout_s: float = 300) -> None:
    """Every controller owns partitions (the last one to join settles the split) and every worker is ready.
    A deadline, not a wait: with CPU hogs beside the suite, workers of the stress run logged nothing for 180 s
    while importing torch and loading their model."""
    waits = [fleet.roles[n].wait_for_log("controller owns partitions", timeout_s) for n in fleet.named("controller")]
    waits += [fleet.roles[n].wait_for_log("worker ready", timeout_s) for n in fleet.named("worker")]
    await asyncio.gather(*waits)


@dataclass(frozen=True)
class LoadFaultTimes:
    hog_s: float = 20.0  # how long the CPU hog runs
    worker_freeze_s: float = 3.0  # under a lease (5 s) minus a heartbeat interval (1 s)
    role_freeze_s: float = 7.0  # a controller or broker frozen past the lease: leases count read time only


def fault_steps(chosen: tuple[str, ...], fleet: Fleet, target: faults.Plane, journal: faults.FaultLog,
                ended_generation_ids: Callable[[], set[str]], broker_down_s: float, role_down_s: float,
                load: LoadFaultTimes = LoadFaultTimes(), receiver: export.MeterReceiver | None = None
                ) -> list[Callable[[], Awaitable[object]]]:
    """One coroutine factory per fault, in the order given (`exporter_kill9` needs the run's receiver)."""
    first = {kind: fleet.named(kind)[0] for kind in ("gateway", "controller", "worker", "projector")}
    steps = {
        "gateway_kill9": lambda: faults.kill_role(target, journal, first["gateway"], role_down_s),
        "controller_kill9": lambda: faults.kill_role(target, journal, first["controller"], role_down_s),
        "worker_kill9": lambda: faults.kill_worker(target, journal, first["worker"]),
        "projector_kill9": lambda: faults.kill_role(target, journal, first["projector"], 1.0),
        "broker_kill9": lambda: faults.kill_broker(target, journal, broker_down_s),
        "postgres_restart": lambda: faults.restart_postgres(target, journal),
        "projections_dropped_and_rebuilt": lambda: faults.rebuild_projections(target, journal),
        "usage_duplicates_and_late": lambda: faults.inject_usage(target, journal, ended_generation_ids()),
        "cpu_hog": lambda: load_faults.cpu_hog(journal, load.hog_s),
        "worker_freeze": lambda: load_faults.freeze_role(target, journal, first["worker"], load.worker_freeze_s),
        "controller_freeze": lambda: load_faults.freeze_role(target, journal, first["controller"],
                                                             load.role_freeze_s),
        "broker_freeze": lambda: load_faults.freeze_broker(target, journal, load.role_freeze_s),
        "exporter_kill9": lambda: export.kill_exporter(target, journal, receiver),
    }
    return [steps[fault] for fault in chosen]
