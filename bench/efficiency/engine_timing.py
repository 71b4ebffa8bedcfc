"""How much the worker's other threads cost its engine: the engine thread's wall seconds in steps and stalled
between them while work was unfinished (`ledgerlm:engine_step_seconds_total` / `engine_stalled_seconds_total` on
the worker's /metrics, consumers/worker/engine_thread.py). The stalled share over a level is what running the
engine in a process of its own could give back at most; slower steps (the interpreter shared inside a step) show
as the ITL ratio instead."""
from __future__ import annotations

import re

import httpx

_LINE = re.compile(r"^ledgerlm:engine_(step|stalled)_seconds_total ([0-9.e+-]+)$", re.MULTILINE)


def parse_timing(text: str) -> dict[str, float]:
    return {f"{kind}_s": float(value) for kind, value in _LINE.findall(text)}


async def sample_timing(url: str) -> dict[str, float] | None:
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            return parse_timing((await http.get(url)).text) or None
    except httpx.HTTPError:
        return None


def stall_share(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """Seconds in steps and stalled over a phase, and the stalled share of the two."""
    if before is None or after is None:
        return None
    step = after.get("step_s", 0.0) - before.get("step_s", 0.0)
    stalled = after.get("stalled_s", 0.0) - before.get("stalled_s", 0.0)
    total = step + stalled
    return {"step_s": round(step, 2), "stalled_s": round(stalled, 3),
            "stalled_share": round(stalled / total, 4) if total > 0 else None}
