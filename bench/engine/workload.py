"""The benchmark workload and its latency statistics (shared by every contender)."""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class BenchRequest:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class Timeline:
    """When each request's output tokens appeared, in seconds after the shared start."""

    token_times: dict[str, list[float]]


def make_workload(num_requests: int, seed: int, vocab_size: int, first_regular_id: int = 6,
                  prompt_range: tuple[int, int] = (16, 1024), output_range: tuple[int, int] = (16, 256)
                  ) -> list[BenchRequest]:
    """Seeded mix: prompt and output lengths uniform in their ranges, random token ids."""
    rng = random.Random(seed)
    out = []
    for i in range(num_requests):
        n = rng.randint(*prompt_range)
        out.append(BenchRequest(f"b{i}", tuple(rng.randrange(first_regular_id, vocab_size) for _ in range(n)),
                                rng.randint(*output_range)))
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summarize(workload: list[BenchRequest], timeline: Timeline, wall_s: float) -> dict:
    """Throughput and TTFT/ITL percentiles; every request arrives at t=0."""
    out_tokens = sum(len(timeline.token_times[r.request_id]) for r in workload)
    expected = sum(r.max_tokens for r in workload)
    prompt_tokens = sum(len(r.prompt) for r in workload)
    ttft = [timeline.token_times[r.request_id][0] for r in workload]
    itl = [b - a for r in workload for a, b in zip(timeline.token_times[r.request_id],
                                                     timeline.token_times[r.request_id][1:])]
    return {
        "requests": len(workload),
        "prompt_tokens": prompt_tokens,
        "output_tokens": out_tokens,
        "output_tokens_expected": expected,
        "wall_s": round(wall_s, 3),
        "output_tok_s": round(out_tokens / wall_s, 2),
        "total_tok_s": round((out_tokens + prompt_tokens) / wall_s, 2),
        "ttft_p50_s": round(percentile(ttft, 50), 4),
        "ttft_p95_s": round(percentile(ttft, 95), 4),
        "itl_p50_s": round(percentile(itl, 50), 4),
        "itl_p95_s": round(percentile(itl, 95), 4),
    }
