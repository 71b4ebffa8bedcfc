"""Every generation (or record) behind a non-zero chaos count, placed in time next to the faults.

A count says that something went wrong; the operator needs which generation,
the evidence (bench/chaos/checks.py gathers it) and what was happening then.
Each violation about a generation gets its client's start and end on the run's
clock (the fault log's: seconds since the faults began) and the nearest fault:
the one whose interval [began_s, at_s] is closest to the generation's lifetime
(0 when they overlap), with `offset_s` = fault start - generation start.
"""
from __future__ import annotations

from bench.chaos.clients import ClientResult


def nearest_fault(faults: list[dict], started_s: float, ended_s: float) -> dict | None:
    def gap(fault: dict) -> float:
        return max(0.0, fault["began_s"] - ended_s, started_s - fault["at_s"])

    if not faults:
        return None
    fault = min(faults, key=gap)
    return {"fault": fault["fault"], "began_s": fault["began_s"], "at_s": fault["at_s"],
            "offset_s": round(fault["began_s"] - started_s, 1), "gap_s": round(gap(fault), 1)}


def place(violations: dict[str, list[dict]], clients: list[ClientResult], faults: list[dict],
          origin: float) -> dict[str, list[dict]]:
    """`violations` with each generation's lifetime, nearest fault and whether the chaos run re-published its
    usage reports (the `usage_duplicates_and_late` fault names the generations it touched)."""
    by_id = {c.generation_id: c for c in clients if c.generation_id}
    injected = {g for f in faults for g in f.get("generation_ids", ())}
    placed: dict[str, list[dict]] = {}
    for kind, found in violations.items():
        placed[kind] = []
        for violation in found:
            client = by_id.get(violation.get("generation_id"))
            if client is not None:
                started = round(client.started_at - origin, 1)
                ended = round((client.ended_at or client.started_at) - origin, 1)
                violation = {**violation, "client_started_s": started, "client_ended_s": ended,
                             "usage_injected": client.generation_id in injected,
                             "nearest_fault": nearest_fault(faults, started, ended)}
            placed[kind].append(violation)
    return placed
