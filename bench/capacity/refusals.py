"""Why the controller refused during a level: its `refused no_capacity` log lines, summarized.

    <date> <time>,<ms> controller INFO ...: refused no_capacity tenant=… tier=… prompt_tokens=… wait_ms=…
        model_ms=… queued_tokens=… pending=… ttft_ms=… model_ttft_ms=… worker=…

Each line carries the shortest predicted wait and its terms (the queue model, the prompt tokens queued ahead,
the dispatches not yet in a heartbeat; the rest is the worker's measured error), so a level's refusals can be
told apart: a queue that was really there, or an error the worker measured earlier.
"""
from __future__ import annotations

import re
import statistics
from datetime import datetime
from pathlib import Path

LINE = re.compile(r"^(\S+ \S+) controller INFO \S+ refused no_capacity .*?wait_ms=(\d+) model_ms=(\d+) "
                  r"queued_tokens=(\d+) pending=(\d+)(?: ttft_ms=(\d+) model_ttft_ms=(\d+))?")
STAMP = "%Y-%m-%d %H:%M:%S,%f"


def refusal_terms(log: Path, t0: float, t1: float) -> dict:
    """The refusals logged between unix times t0 and t1: how many, and the median and max of each term."""
    rows = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else ():
        found = LINE.match(line)
        if found is None:
            continue
        at = datetime.strptime(found.group(1), STAMP).timestamp()  # the role logs local time, as this does
        if t0 <= at <= t1:
            wait, model, queued, pending = (int(found.group(i)) for i in range(2, 6))
            row = {"wait_ms": wait, "model_ms": model, "error_ms": wait - model, "queued_tokens": queued,
                   "pending": pending}
            if found.group(6) is not None:  # the TTFT the refusal judged (lines before 2026-12-07 lack it)
                row |= {"ttft_ms": int(found.group(6)), "model_ttft_ms": int(found.group(7))}
            rows.append(row)
    if not rows:
        return {"n": 0}
    return {"n": len(rows), **{f"{term}_{name}": round(pick([r[term] for r in rows]), 1)
                               for term in rows[0] for name, pick in (("p50", statistics.median), ("max", max))}}
