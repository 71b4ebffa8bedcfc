"""Faults that look like load, not death: nothing that was alive may be interrupted by them.

    cpu_hog            2 busy processes per core for `hog_s`, beside the whole stack
    worker_freeze      SIGSTOP the first worker for `worker_freeze_s` (under lease - heartbeat interval), SIGCONT
    controller_freeze  SIGSTOP the first controller for `role_freeze_s` (longer than the lease), SIGCONT
    broker_freeze      SIGSTOP the broker leading llm.generations partition 0 for `role_freeze_s`, SIGCONT

A worker frozen for less than its lease minus one heartbeat interval keeps its lease: its next heartbeat
is sent as it wakes. A frozen controller or broker may stay frozen longer than the lease: a controller
judges leases as of the time it has read the heartbeats through, so neither its own pause nor the broker's
reads as the workers' silence (`WorkerHeartbeat.within_lease`).
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time

from bench.chaos.faults import FaultLog, Plane, leader_of
from infra.state import ServicesState
from schemas.topics import GENERATIONS

LOAD_FAULTS = ("cpu_hog", "worker_freeze", "controller_freeze", "broker_freeze")


def _spin(until: float) -> None:
    while time.monotonic() < until:
        pass


async def cpu_hog(journal: FaultLog, seconds: float, per_core: int = 2) -> None:
    """`per_core` busy processes per core for `seconds`, then gone."""
    count = per_core * (os.cpu_count() or 1)
    began = time.monotonic()
    context = multiprocessing.get_context("spawn")  # no copy of this process's event loop or threads
    hogs = [context.Process(target=_spin, args=(began + seconds,), daemon=True) for _ in range(count)]
    for hog in hogs:
        hog.start()
    try:
        await asyncio.to_thread(lambda: [hog.join(seconds + 30) for hog in hogs])
    finally:
        for hog in hogs:
            if hog.is_alive():
                hog.kill()
    journal.add("cpu_hog", began, processes=count, seconds=seconds)


async def freeze_pid(pid: int, seconds: float) -> None:
    """SIGSTOP `pid`, wait `seconds`, SIGCONT it (also when cancelled: a frozen process is never left behind)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


async def freeze_role(plane: Plane, journal: FaultLog, name: str, seconds: float) -> None:
    role = plane.roles[name]
    if role.proc is None or not role.running:
        raise RuntimeError(f"{name} is not running: nothing to freeze")
    began = time.monotonic()
    await freeze_pid(role.proc.pid, seconds)
    journal.add(f"{role.name}_freeze", began, frozen=name, seconds=seconds)


async def freeze_broker(plane: Plane, journal: FaultLog, seconds: float) -> None:
    index = await leader_of(plane.bootstrap, GENERATIONS, 0)
    state = ServicesState.load(plane.services.settings.state_file)
    pid = state.kafka_brokers[index - 1].pid
    if pid is None:
        raise RuntimeError(f"broker {index} has no recorded pid: nothing to freeze")
    began = time.monotonic()
    await freeze_pid(pid, seconds)
    journal.add("broker_freeze", began, broker=index, seconds=seconds)
