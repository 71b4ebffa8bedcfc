"""What the ledgerlm worker says about itself during a level: its /metrics (scraped) and heartbeats (followed).

    /metrics      kv_blocks_used / free / reserved, num_requests_running / waiting, every counter whose name
                  has "preempt" or "recompute" in it (read by pattern: their names are still settling), the
                  request_queue_time_seconds histogram and, for interactive attempts, queue_wait_promise_ratio
                  (observed / predicted wait before the first scheduling) and ttft_promise_ratio (observed /
                  predicted decision to first token): how the admission kept its promise
    heartbeats    queued tokens and running attempts (HeartbeatSampler of the serving bench)
"""
from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence

import httpx

from bench.capacity.metrics import counter_increase, gained_bounds, histogram_quantiles, kv_usage

PREFIX = "ledgerlm:"
GAUGES = {"kv_blocks_used": "used", "kv_blocks_free": "free", "kv_blocks_reserved": "reserved",
          "num_requests_running": "running", "num_requests_waiting": "waiting"}
PREEMPTION_WORDS = ("preempt", "recompute")
QUEUE_TIME = "request_queue_time_seconds"
PROMISE = "queue_wait_promise_ratio"
TTFT_PROMISE = "ttft_promise_ratio"


def parse_worker_metrics(text: str) -> dict:
    """One scrape: the gauges under their short names, `counters` (preemption-like, by sample name), and the
    queue-time histogram (`queue_buckets` upper bound -> cumulative count, `queue_sum`, `queue_count`)."""
    from prometheus_client.parser import text_string_to_metric_families

    sample: dict = {"counters": {}, "queue_buckets": {}, "promise_buckets": {}, "ttft_promise_buckets": {}}
    for family in text_string_to_metric_families(text):
        for name, labels, value in ((s.name, s.labels, s.value) for s in family.samples):
            short = name.removeprefix(PREFIX)
            if short in GAUGES:
                sample[GAUGES[short]] = int(value)
            elif short.endswith("_total") and any(word in short for word in PREEMPTION_WORDS):
                sample["counters"][short] = sample["counters"].get(short, 0.0) + value
            elif short == f"{QUEUE_TIME}_bucket":
                sample["queue_buckets"][float(labels["le"])] = value
            elif short == f"{QUEUE_TIME}_sum":
                sample["queue_sum"] = value
            elif short == f"{QUEUE_TIME}_count":
                sample["queue_count"] = value
            elif short == f"{PROMISE}_bucket" and labels.get("tier") == "interactive":
                sample["promise_buckets"][float(labels["le"])] = value
            elif short == f"{TTFT_PROMISE}_bucket" and labels.get("tier") == "interactive":
                sample["ttft_promise_buckets"][float(labels["le"])] = value
    return sample


def preemptions(counters: dict[str, float]) -> float | None:
    """The preemption count among the counters' increases: the sum of those named *preempt* (recompute counters
    are reported beside it); None when the worker exposes none."""
    named = [v for k, v in counters.items() if "preempt" in k]
    return sum(named) if named else None


def scrape_summary(samples: Sequence[dict], t0: float, t1: float) -> dict:
    """KV use, preemptions and queue time over [t0, t1] from scrapes `{"t", ...parse_worker_metrics}`; the scrape
    just before t0 (when there is one) is the baseline of the counters."""
    inside = [s for s in samples if t0 <= s["t"] <= t1 and "used" in s and "free" in s]
    before = [s for s in samples if s["t"] < t0]
    if not inside:
        return {**kv_usage([]), "preemptions": None, "preemption_counters": None, "queue_time": None,
                "worker_metrics_note": "no /metrics scrape during the level"}
    first, last = (before[-1] if before else inside[0]), inside[-1]
    increase = counter_increase(first["counters"], last["counters"])
    queue = None
    if last["queue_buckets"]:
        queue = histogram_quantiles(first["queue_buckets"], last["queue_buckets"],
                                    last.get("queue_sum", 0.0) - first.get("queue_sum", 0.0),
                                    last.get("queue_count", 0.0) - first.get("queue_count", 0.0))
    waiting = [s.get("waiting", 0) for s in inside]
    return {**kv_usage(inside), "preemptions": preemptions(increase), "preemption_counters": increase or None,
            "engine_waiting_peak": max(waiting), "queue_time": queue,
            "interactive_wait_promise_ratio": promise_summary(first, last),
            "interactive_ttft_promise_ratio": promise_summary(first, last, "ttft_promise_buckets"),
            **({} if increase else {"worker_metrics_note": "the worker exposes no preemption counter"})}


def promise_summary(first: dict, last: dict, buckets: str = "promise_buckets") -> dict:
    """Observed / predicted wait (or TTFT) of the interactive attempts first scheduled (or with a first token)
    between two scrapes: the bucket bounds of its median and p95 (the histogram's buckets are 0.25 ... 10)."""
    n, (p50, p95) = gained_bounds(first.get(buckets, {}), last.get(buckets, {}), (0.5, 0.95))
    return {"n": n, "p50_le": p50, "p95_le": p95}


def heartbeat_summary(samples: Sequence[dict]) -> dict:
    """Queued tokens and running attempts from heartbeats `{"queued_tokens", "running", ...}`, and the step
    costs the controller priced the queue with (`full_step_ms`: a decode step plus the token budget at the cost
    of a prefill token), median and max over the level."""
    if not samples:
        return {"heartbeats": 0, "queued_tokens_peak": None, "queued_tokens_mean": None, "running_peak": None}
    queued = [s["queued_tokens"] for s in samples]
    full = [s["decode_step_ms"] + s["max_batched_tokens"] * s["prefill_token_ms"] for s in samples
            if s.get("decode_step_ms") and s.get("prefill_token_ms") and s.get("max_batched_tokens")]
    return {"heartbeats": len(samples), "queued_tokens_peak": max(queued),
            "queued_tokens_mean": round(sum(queued) / len(queued), 1),
            "running_peak": max(s["running"] for s in samples),
            "full_step_ms": {"p50": round(statistics.median(full), 1), "max": round(max(full), 1)} if full else None}


class WorkerScraper:
    """Scrapes one worker's /metrics every `interval_s` while running; keeps every parsed scrape."""

    def __init__(self, url: str, interval_s: float = 0.5) -> None:
        self.url = url
        self.interval_s = interval_s
        self.samples: list[dict] = []
        self.errors = 0

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=max(1.0, self.interval_s * 2)) as http:
            while True:
                started = time.monotonic()
                try:
                    response = await http.get(self.url)
                    self.samples.append({"t": started, **parse_worker_metrics(response.text)})
                except (httpx.HTTPError, ValueError):
                    self.errors += 1
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
