"""`bench chaos --repeat N`: the whole chaos run N times, each on a fresh stack, and what they add up to.

A fault that overbills one run in two passes a single run half the time; N runs
make a rare violation visible. The summary holds every count summed over the
runs, the runs that had any non-zero count, and each run's violations by kind.
"""
from __future__ import annotations

import logging
import time

from bench.chaos.export import COUNTS as EXPORT_COUNTS
from bench.chaos.run import ChaosConfig, run_chaos_bench

# The counts that must all be 0 (every one of them in each run's report).
ZERO_KEYS = ("stuck", "audit_differences", "overbilled", "duplicate_seqs", "missing_seqs", "unreleased_reservations",
             "lost_events", "interrupted_alive", *EXPORT_COUNTS)
log = logging.getLogger("ledgerlm.chaos")


async def run_repeated(config: ChaosConfig, repeat: int) -> dict:
    """{"summary": ..., "runs": [report, ...]}; a run that raises is recorded with its error and counts as failed."""
    runs: list[dict] = []
    for number in range(1, repeat + 1):
        began = time.monotonic()
        log.info("chaos run %d/%d starting", number, repeat)
        try:
            report = await run_chaos_bench(config)
        except Exception as exc:  # a stack that did not come up is a failed run, not the end of the series
            log.error("chaos run %d/%d failed error=%s", number, repeat, type(exc).__name__)
            report = {"error": f"{type(exc).__name__}: {exc}"}
        report["run"], report["wall_s"] = number, round(time.monotonic() - began, 1)
        runs.append(report)
        log.info("chaos run %d/%d counts=%s", number, repeat, counts_of(report))
    return {"summary": summarize(runs), "runs": runs}


def counts_of(report: dict) -> dict[str, int] | None:
    return None if "error" in report else {key: report[key] for key in ZERO_KEYS}


def failed(report: dict) -> bool:
    counts = counts_of(report)
    return counts is None or any(counts.values())


def summarize(runs: list[dict]) -> dict:
    measured = [r for r in runs if "error" not in r]
    return {
        "runs": len(runs),
        "failed_runs": [r["run"] for r in runs if failed(r)],
        "errors": {r["run"]: r["error"] for r in runs if "error" in r},
        "totals": {key: sum(r[key] for r in measured) for key in ZERO_KEYS},
        # the worst run's share of failed requests (target: at most 0.001)
        "availability_error_fraction": max((r["availability_error_fraction"] for r in measured
                                            if "availability_error_fraction" in r), default=None),
        "per_run": [{"run": r["run"], "wall_s": r["wall_s"], "counts": counts_of(r),
                     "availability_error_fraction": r.get("availability_error_fraction"),
                     "generations": r.get("generations", {}).get("admitted")} for r in runs],
        "violations": {r["run"]: {kind: [v.get("generation_id") for v in found]
                                  for kind, found in r.get("violations", {}).items()} for r in measured
                       if r.get("violations")},
    }
