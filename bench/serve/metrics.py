"""What one request saw, and the report over many: latency percentiles, SLO goodput, rejections, token shares.

Pure: records in, JSON-ready dicts out. Times are seconds since the load started (one monotonic clock).
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bench.common import percentile


@dataclass(frozen=True)
class Slo:
    ttft_s: float = 1.0
    itl_s: float = 0.050


SLO = Slo()

DEFINITIONS = {
    "ttft": "request sent -> first chunk carrying output text or tokens, per request",
    "itl": "per request: (last token chunk - first token chunk) / (output tokens - 1), i.e. the mean gap "
           "between successive output tokens (vLLM's TPOT); requests with one output token have none",
    "e2e": "request sent -> end of its stream",
    "good_request": "status 2xx, a final event/usage received, ttft <= slo.ttft_s and itl <= slo.itl_s "
                    "(itl counts as met when there is a single output token)",
    "goodput_rps": "good requests / load window (the plan's duration)",
    "slo_holds": "over one mix: p95(ttft) <= slo.ttft_s and p95(itl) <= slo.itl_s and at least 95% of the "
                 "requests sent completed (rejections and errors count against it)",
    "capacity_rps": "the highest swept rate at which slo_holds for the interactive mix (0 when none); the sweep "
                    "stops at the first rate that misses; capacity_is_lower_bound when the top rate still held",
    "served_token_share": "a tenant's output tokens / all output tokens delivered in the window",
    "settled_s": "before each phase, seconds until a one-token request returned within 0.5 s (at most 30): "
                 "what the previous phase left running",
}


@dataclass
class RequestRecord:
    """One request as its client saw it."""

    index: int
    tenant: str
    mix: str
    api: str
    sent_at: float
    status: int | None = None  # HTTP status; None when the connection failed
    error: str | None = None  # error class or stream error code ("deadline": cut at the phase's end), never a body
    end_reason: str | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    done_at: float | None = None
    token_chunks: list[tuple[float, int]] = field(default_factory=list)  # (time, tokens in the chunk)

    @property
    def completed(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and self.end_reason is not None

    @property
    def ttft(self) -> float | None:
        return self.token_chunks[0][0] - self.sent_at if self.token_chunks else None

    @property
    def itl(self) -> float | None:
        if len(self.token_chunks) < 1 or self.output_tokens < 2:
            return None
        return (self.token_chunks[-1][0] - self.token_chunks[0][0]) / (self.output_tokens - 1)

    @property
    def e2e(self) -> float | None:
        return None if self.done_at is None else self.done_at - self.sent_at

    def is_good(self, slo: Slo = SLO) -> bool:
        if not self.completed or self.ttft is None:
            return False
        return self.ttft <= slo.ttft_s and (self.itl is None or self.itl <= slo.itl_s)


def _ms(value: float) -> float | None:
    return None if math.isnan(value) else round(value * 1000, 1)


def distribution(values: Iterable[float | None]) -> dict:
    present = [v for v in values if v is not None]
    return {"n": len(present), **{f"p{q}": _ms(percentile(present, q / 100)) for q in (50, 95, 99)}}


def summarize_group(records: Sequence[RequestRecord], window_s: float, slo: Slo = SLO) -> dict:
    """Latencies (ms), statuses, goodput and whether the SLO holds over one group of requests."""
    completed = [r for r in records if r.completed]
    good = sum(r.is_good(slo) for r in records)
    ttft, itl = distribution(r.ttft for r in completed), distribution(r.itl for r in completed)
    statuses = Counter(r.error or str(r.status) for r in records)
    holds = (bool(records) and len(completed) >= 0.95 * len(records)
             and ttft["p95"] is not None and ttft["p95"] <= slo.ttft_s * 1000
             and (itl["p95"] is None or itl["p95"] <= slo.itl_s * 1000))
    return {"sent": len(records), "completed": len(completed), "statuses": dict(sorted(statuses.items())),
            "rejections": {k: v for k, v in sorted(statuses.items()) if k.isdigit() and not k.startswith("2")},
            "errors": {k: v for k, v in sorted(statuses.items()) if not k.isdigit()},
            "ttft_ms": ttft, "itl_ms": itl, "e2e_ms": distribution(r.e2e for r in completed),
            "output_tokens": sum(r.output_tokens for r in completed),
            "good": good, "goodput_fraction": round(good / len(records), 3) if records else None,
            "goodput_rps": round(good / window_s, 3) if window_s > 0 else None, "slo_holds": holds}


def group_by(records: Sequence[RequestRecord], key: str) -> dict[str, list[RequestRecord]]:
    groups: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in records:
        groups[getattr(record, key)].append(record)
    return dict(sorted(groups.items()))


def served_token_shares(records: Sequence[RequestRecord]) -> dict[str, float]:
    tokens = Counter({tenant: sum(r.output_tokens for r in group)
                      for tenant, group in group_by(records, "tenant").items()})
    total = sum(tokens.values())
    return {tenant: round(n / total, 3) if total else 0.0 for tenant, n in sorted(tokens.items())}


def token_share_series(records: Sequence[RequestRecord], bin_s: float) -> list[dict]:
    """Per time bin: output tokens delivered to each tenant (by chunk arrival time)."""
    bins: dict[int, Counter] = defaultdict(Counter)
    for record in records:
        for at, tokens in record.token_chunks:
            bins[int(at // bin_s)][record.tenant] += tokens
    return [{"t_s": round(b * bin_s, 3), "tokens": dict(sorted(bins[b].items()))} for b in sorted(bins)]


def summarize(records: Sequence[RequestRecord], window_s: float, slo: Slo = SLO, bin_s: float = 1.0) -> dict:
    """The whole run: per mix, per tenant, and per tenant-and-mix, plus token shares over time."""
    return {"window_s": window_s,
            "by_mix": {mix: summarize_group(group, window_s, slo) for mix, group in group_by(records, "mix").items()},
            "by_tenant": {tenant: summarize_group(group, window_s, slo)
                          for tenant, group in group_by(records, "tenant").items()},
            "by_api": {api: summarize_group(group, window_s, slo) for api, group in group_by(records, "api").items()},
            "served_token_share": served_token_shares([r for r in records if r.completed]),
            "token_share_series": token_share_series(records, bin_s)}


def capacity(sweep: Sequence[dict]) -> float:
    """The highest rate whose run held the SLO (`{"rate": r, "slo_holds": bool}` entries); 0.0 when none did."""
    return max((point["rate"] for point in sweep if point["slo_holds"]), default=0.0)


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours / theirs; None when either is unknown or theirs is 0 (the report then says why)."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return round(ours / theirs, 3)
