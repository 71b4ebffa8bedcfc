"""CPU time of processes and threads from `/proc` (Linux): what each role of the platform spent.

    /proc/<pid>/stat                 utime stime (own, every thread, live or exited) cutime cstime (reaped children)
    /proc/<pid>/task/<tid>/stat      one thread's utime stime
    /proc/<pid>/task/<tid>/comm      the thread's OS name (the worker names its engine thread "engine")

Counts are clock ticks (`SC_CLK_TCK` per second). A process that vanished reads as None.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    ppid: int
    utime: int
    stime: int
    cutime: int
    cstime: int

    @property
    def own_ticks(self) -> int:
        return self.utime + self.stime

    @property
    def total_ticks(self) -> int:
        """Own time plus that of the children it has reaped (a Postgres backend that exited lands here)."""
        return self.utime + self.stime + self.cutime + self.cstime


def parse_stat(line: str) -> ProcStat:
    """One `/proc/.../stat` line. The name sits in parentheses and may itself hold spaces and parentheses,
    so the fields after it are found from the last ')'."""
    head, _, tail = line.rpartition(")")
    pid, _, comm = head.partition(" (")
    fields = tail.split()
    # fields[0] is field 3 of proc(5) (state): ppid is field 4, utime..cstime fields 14..17.
    return ProcStat(pid=int(pid), comm=comm, ppid=int(fields[1]), utime=int(fields[11]), stime=int(fields[12]),
                    cutime=int(fields[13]), cstime=int(fields[14]))


def read_stat(path: Path) -> ProcStat | None:
    try:
        return parse_stat(path.read_text())
    except (OSError, ValueError, IndexError):
        return None


def process_ticks(pid: int) -> int | None:
    stat = read_stat(PROC / str(pid) / "stat")
    return None if stat is None else stat.total_ticks


def thread_ticks(pid: int, name: str) -> int:
    """Ticks of the live threads of `pid` whose OS name is `name`."""
    total = 0
    for task in (PROC / str(pid) / "task").glob("*"):
        try:
            if (task / "comm").read_text().strip() != name:
                continue
        except OSError:
            continue
        stat = read_stat(task / "stat")
        total += stat.own_ticks if stat else 0
    return total


def all_stats() -> list[ProcStat]:
    stats = []
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := read_stat(entry / "stat")) is not None:
            stats.append(stat)
    return stats


def tree_ticks(root: int, stats: Iterable[ProcStat] | None = None) -> int | None:
    """Ticks of `root` and every live descendant (with what each has reaped): a PostgreSQL cluster is its
    postmaster, the checkpointer, walwriter, autovacuum and every connection's backend."""
    by_parent: dict[int, list[ProcStat]] = {}
    own: ProcStat | None = None
    for stat in stats if stats is not None else all_stats():
        by_parent.setdefault(stat.ppid, []).append(stat)
        if stat.pid == root:
            own = stat
    if own is None:
        return None
    total, pending = own.total_ticks, [root]
    while pending:
        for child in by_parent.get(pending.pop(), []):
            total += child.total_ticks
            pending.append(child.pid)
    return total


Probe = Callable[[], int | None]


class CpuSampler:
    """Named probes, each returning ticks (None when its process is gone); `sample()` reads them all."""

    def __init__(self, probes: dict[str, Probe]) -> None:
        self.probes = probes

    def sample(self) -> dict[str, int | None]:
        return {role: probe() for role, probe in self.probes.items()}


def cpu_seconds(before: dict[str, int | None], after: dict[str, int | None]) -> dict[str, float | None]:
    """CPU seconds per role between two samples; None where either sample missed the role."""
    return {role: None if before.get(role) is None or after.get(role) is None
            else (after[role] - before[role]) / CLK_TCK for role in after}
