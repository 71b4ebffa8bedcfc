"""The capacity bench's numbers: one level's summary from its attempts and samples, saturation, ratios, targets.

Pure: records and samples in, JSON-ready dicts out. Times are seconds since the level started.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

from bench.capacity.client import CUT, REFUSALS
from bench.serve.metrics import RequestRecord, distribution, ratio

DEFINITIONS = {
    "attempt": "one HTTP request (a refused request retried after its Retry-After is a new attempt of the same "
               "request); the engine alone has no refusals",
    "completed / refused_429 / refused_503 / other": "attempts that ended with a 2xx and a finish_reason / "
                                                     "answered 429 / answered 503 / anything else (other statuses, "
                                                     "connection or stream errors, a 2xx without an end)",
    "cut_at_end": "attempts still streaming when the level's drain ended (not counted as other)",
    "refusal_codes": "429/503 attempts by status and the error code of their body",
    "completed_fraction": "completed / (completed + refused_429 + refused_503 + other)",
    "abandoned_refused": "requests whose last attempt was refused and whose Retry-After fell after the window",
    "output_tok_s": "output tokens whose chunk arrived within the window (duration_s) / duration_s; a chunk's "
                    "tokens are the usage's count spread over the request's chunks",
    "completed_output_tok_s": "output tokens of the attempts that completed within the window / duration_s "
                              "(guidellm's accounting: a request cut at the end counts nothing)",
    "ttft": "attempt sent -> first chunk with content, completed attempts (retry waits not included)",
    "itl": "per completed request: (last content chunk - first) / (output tokens - 1), i.e. the mean gap between "
           "tokens (a chunk may carry several tokens), as the serve bench",
    "retry_wait": "per completed request: its first attempt sent -> the attempt that completed was sent",
    "kv_blocks_used": "the engine's KV blocks referenced by sequences (worker /metrics `kv_blocks_used`, sampled "
                      "every 0.5 s; the engine alone: after every step), peak and mean over the window; "
                      "pool = used + free",
    "kv_blocks_reserved": "blocks the worker reserved for accepted attempts (its admission accounting)",
    "working_set_blocks": "concurrency x blocks of one request (prompt + mean output tokens observed on this mix, "
                          "16-token blocks): what the pool must hold for every client to run at once",
    "preemptions": "increase over the level of the worker's preemption counters (any metric named *preempt*; "
                   "null when the worker exposes none)",
    "queue_time": "worker request_queue_time_seconds (admission -> first scheduled) over the level: p50/p95 as "
                  "the upper bound of the histogram bucket holding that quantile, and the mean",
    "saturation": "per server and mix, the level with the highest output_tok_s (the lowest on a tie; null when "
                  "no level produced a token)",
    "load_avg_at_start": "os.getloadavg() when the level started: other work on a shared machine",
}


def window_tokens(records: Sequence[RequestRecord], window_s: float) -> int:
    return sum(tokens for r in records for at, tokens in r.token_chunks if at <= window_s)


def outcome(record: RequestRecord) -> str:
    if record.completed:
        return "completed"
    if record.error == CUT:
        return CUT
    if record.status in REFUSALS and record.error is None:
        return f"refused_{record.status}"
    return "other"


def requests_view(records: Sequence[RequestRecord]) -> dict:
    """Per logical request: how many completed, were abandoned while refused, and waited for retries."""
    by_index: dict[int, list[RequestRecord]] = defaultdict(list)
    for record in records:
        by_index[record.index].append(record)
    waits, abandoned = [], 0
    for attempts in by_index.values():
        last = attempts[-1]
        if last.completed:
            waits.append(last.sent_at - attempts[0].sent_at)
        elif outcome(last).startswith("refused"):
            abandoned += 1
    return {"requests": len(by_index), "requests_completed": len(waits), "abandoned_refused": abandoned,
            "retry_wait_ms": distribution(waits)}


def attempt_counts(records: Sequence[RequestRecord]) -> dict:
    kinds = Counter(outcome(r) for r in records)
    answered = sum(n for kind, n in kinds.items() if kind != CUT)
    other = Counter(r.error or str(r.status) for r in records if outcome(r) == "other")
    codes = Counter(f"{r.status} {getattr(r, 'code', None)}" for r in records if r.status in REFUSALS)
    return {"attempts": len(records), "completed": kinds["completed"], "refused_429": kinds["refused_429"],
            "refused_503": kinds["refused_503"], "other": kinds["other"], "other_kinds": dict(sorted(other.items())),
            "refusal_codes": dict(sorted(codes.items())), CUT: kinds[CUT],
            "completed_fraction": round(kinds["completed"] / answered, 4) if answered else None}


def client_summary(records: Sequence[RequestRecord], window_s: float) -> dict:
    """What the clients saw over one level."""
    completed = [r for r in records if r.completed]
    tokens = window_tokens(records, window_s)
    outputs = [r.output_tokens for r in completed]
    return {**attempt_counts(records), **requests_view(records),
            "output_tokens_in_window": tokens, "output_tok_s": round(tokens / window_s, 2) if window_s > 0 else None,
            "completed_output_tok_s": completed_tok_s(completed, window_s),
            "ttft_ms": distribution(r.ttft for r in completed), "itl_ms": distribution(r.itl for r in completed),
            "output_tokens_per_request": {"mean": round(sum(outputs) / len(outputs), 1) if outputs else None,
                                          "max": max(outputs, default=None)},
            "prompt_tokens_mean": mean([r.prompt_tokens for r in completed if r.prompt_tokens is not None]),
            "finish_reasons": dict(sorted(Counter(r.end_reason for r in completed).items()))}


def completed_tok_s(completed: Sequence[RequestRecord], window_s: float) -> float | None:
    """Output tokens of the attempts that ended within the window, over it: how guidellm counts its tok/s."""
    if window_s <= 0:
        return None
    tokens = sum(r.output_tokens or 0 for r in completed if r.done_at is not None and r.done_at <= window_s)
    return round(tokens / window_s, 2)


def mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def kv_usage(samples: Sequence[dict]) -> dict:
    """Peak and mean of `used` (and `reserved` where sampled) over samples `{used, free[, reserved]}`."""
    if not samples:
        return {"pool_blocks": None, "kv_blocks_used_peak": None, "kv_blocks_used_mean": None}
    pool = max(s["used"] + s["free"] for s in samples)
    used = [s["used"] for s in samples]
    out = {"pool_blocks": pool, "kv_blocks_used_peak": max(used),
           "kv_blocks_used_mean": round(sum(used) / len(used), 1),
           "kv_used_peak_fraction": round(max(used) / pool, 3) if pool else None,
           "kv_used_mean_fraction": round(sum(used) / len(used) / pool, 3) if pool else None, "samples": len(samples)}
    reserved = [s["reserved"] for s in samples if s.get("reserved") is not None]
    if reserved:
        out.update(kv_blocks_reserved_peak=max(reserved),
                   kv_blocks_reserved_mean=round(sum(reserved) / len(reserved), 1))
    return out


def counter_increase(first: dict[str, float], last: dict[str, float]) -> dict[str, float]:
    """Per counter name, last - first (a counter that appeared during the level started at 0)."""
    return {name: round(value - first.get(name, 0.0), 3) for name, value in sorted(last.items())}


def histogram_quantiles(first: dict[float, float], last: dict[float, float], total_s: float, count: float) -> dict:
    """p50/p95 (upper bucket bounds, ms) and mean (ms) of what a cumulative histogram gained between two scrapes:
    `first`/`last` map each bucket's upper bound (inf included) to its cumulative count."""
    n, (p50, p95) = gained_bounds(first, last, (0.5, 0.95))
    if n <= 0:
        return {"n": 0, "p50_le_ms": None, "p95_le_ms": None, "mean_ms": None}
    return {"n": n, "p50_le_ms": None if p50 is None else round(p50 * 1000, 1),
            "p95_le_ms": None if p95 is None else round(p95 * 1000, 1),
            "mean_ms": round(total_s / count * 1000, 1) if count > 0 else None}


def gained_bounds(first: dict[float, float], last: dict[float, float],
                  quantiles: Sequence[float]) -> tuple[int, list[float | None]]:
    """How many observations a cumulative histogram gained between two scrapes, and for each quantile the upper
    bound of the bucket it falls in (None: past the last finite bound, or nothing gained)."""
    gained = {bound: last.get(bound, 0.0) - first.get(bound, 0.0) for bound in sorted(last)}
    n = gained.get(math.inf, 0.0)
    if n <= 0:
        return 0, [None for _ in quantiles]

    def upper(q: float) -> float | None:
        bound = next(b for b, c in gained.items() if c >= q * n)
        return None if math.isinf(bound) else bound

    return int(n), [upper(q) for q in quantiles]


def blocks_for(tokens: float, block_size: int = 16) -> int:
    return math.ceil(tokens / block_size)


def working_set(concurrency: int, prompt_tokens: float | None, output_tokens: float | None, pool: int | None,
                block_size: int = 16) -> dict:
    if prompt_tokens is None or output_tokens is None:
        return {"working_set_blocks": None, "pool_holds_working_set": None}
    blocks = concurrency * blocks_for(prompt_tokens + output_tokens, block_size)
    return {"working_set_blocks": blocks, "pool_holds_working_set": None if pool is None else blocks <= pool}


def saturation(levels: Sequence[dict]) -> int | None:
    """The concurrency with the highest output_tok_s (lowest on a tie); None when no level produced a token."""
    best = max(levels, key=lambda lv: (lv.get("output_tok_s") or 0, -lv["concurrency"]), default=None)
    return None if best is None or not best.get("output_tok_s") else best["concurrency"]


def level_at(levels: Sequence[dict], concurrency: int | None) -> dict | None:
    return next((lv for lv in levels if lv["concurrency"] == concurrency), None)


def ratios(runs: dict[str, dict[str, dict]]) -> dict:
    """Per mix, at ledgerlm's saturation: its tok/s over transformers serve's at *its* saturation, and over the
    engine alone at the same concurrency. `runs[server][mix]` = {"levels": [...], "saturation": c}."""
    out = {}
    mixes = sorted({mix for by_mix in runs.values() for mix in by_mix})
    for mix in mixes:
        ours = runs.get("ledgerlm", {}).get(mix)
        ours_level = level_at(ours["levels"], ours["saturation"]) if ours else None
        ours_tok_s = ours_level["output_tok_s"] if ours_level else None
        theirs = runs.get("transformers_serve", {}).get(mix)
        theirs_level = level_at(theirs["levels"], theirs["saturation"]) if theirs else None
        engine = runs.get("engine", {}).get(mix)
        engine_level = level_at(engine["levels"], ours["saturation"]) if engine and ours else None
        out[mix] = {
            "ledgerlm_saturation": ours["saturation"] if ours else None, "ledgerlm_output_tok_s": ours_tok_s,
            "transformers_serve_saturation": theirs["saturation"] if theirs else None,
            "transformers_serve_output_tok_s": theirs_level["output_tok_s"] if theirs_level else None,
            "engine_output_tok_s_same_concurrency": engine_level["output_tok_s"] if engine_level else None,
            "platform_vs_transformers_serve": ratio(ours_tok_s, theirs_level["output_tok_s"] if theirs_level else None),
            "platform_vs_engine": ratio(ours_tok_s, engine_level["output_tok_s"] if engine_level else None)}
    return out
