"""A tenant's sealed usage over a window, per bucket (hour or day) and model version (no HTTP here).

Every figure is read from the rows a seal fixed and the rows beside them, per sealed generation:

    billed*            billing_ledger: what the invoice counts (input, cached input, output)
    processed/cached   every attempt's watermark: the prompt work the engines recorded
    generated          every attempt's recorded output, plus the unbilled tail (streamed, never recorded)
    delivered          the billed attempt's stream: tokens the client could receive
    recompute          work redone after a preemption: never billed
    interrupted        generations ended by a lost worker, billed at their last watermark ("recorded only")

A generation counts in the bucket of its seal time (UTC). The window keeps today's rule: the buckets
whose start lies in [floor(from), to).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta

UNITS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
MAX_BUCKETS = {"hour": 31 * 24, "day": 366}
MAX_MODEL_LENGTH = 256


class UsageQueryError(ValueError):
    """A bad usage query: `fields` names the parameters, the message says what is expected."""

    def __init__(self, message: str, *names: str) -> None:
        super().__init__(message)
        self.fields = list(names)


def floor_to(moment: datetime, granularity: str) -> datetime:
    utc = moment.astimezone(UTC)
    if granularity == "day":
        return utc.replace(hour=0, minute=0, second=0, microsecond=0)
    return utc.replace(minute=0, second=0, microsecond=0)


def ceil_to(moment: datetime, granularity: str) -> datetime:
    floor = floor_to(moment, granularity)
    return floor if floor == moment else floor + UNITS[granularity]


@dataclass(frozen=True)
class UsageWindow:
    """A validated query: [start, end) with its granularity and an optional model (a version or a name)."""

    start: datetime
    end: datetime
    granularity: str
    model: str | None

    @classmethod
    def of(cls, start: datetime | None, end: datetime | None, granularity: str, model: str | None,
           now: datetime) -> "UsageWindow":
        if granularity not in UNITS:
            raise UsageQueryError(f"granularity must be one of {', '.join(UNITS)}, got {granularity[:20]!r}",
                                  "granularity")
        if (start is not None and start.tzinfo is None) or (end is not None and end.tzinfo is None):
            raise UsageQueryError("from/to need a UTC offset (e.g. 2026-11-29T10:00:00Z)", "from", "to")
        end = end or now
        start = start or end - timedelta(hours=24)
        if start >= end:
            raise UsageQueryError("from must be before to", "from", "to")
        window = cls(start, end, granularity, check_model(model))
        if window.buckets > MAX_BUCKETS[granularity]:
            raise UsageQueryError(f"at most {MAX_BUCKETS[granularity]} {granularity} buckets per query, this "
                                  f"window has {window.buckets}; narrow from/to or use a coarser granularity",
                                  "from", "to", "granularity")
        return window

    @property
    def lower(self) -> datetime:
        return floor_to(self.start, self.granularity)

    @property
    def upper(self) -> datetime:
        """Seals before this instant are in a bucket that starts before `end`."""
        return ceil_to(self.end, self.granularity)

    @property
    def buckets(self) -> int:
        return round((self.upper - self.lower) / UNITS[self.granularity])


def check_model(model: str | None) -> str | None:
    if model is None:
        return None
    if not model or len(model) > MAX_MODEL_LENGTH or not all(" " < c <= "~" for c in model):
        raise UsageQueryError(f"model must be a version NAME@V or a name: 1 to {MAX_MODEL_LENGTH} printable "
                              "ASCII characters without spaces", "model")
    return model


@dataclass(frozen=True)
class ModelUsage:
    """Sealed usage of one model version (in one bucket, or over the window)."""

    model_version: str
    generations: int = 0
    billed_input_tokens: int = 0
    billed_cached_input_tokens: int = 0
    billed_output_tokens: int = 0
    interrupted_generations: int = 0
    interrupted_input_tokens: int = 0
    interrupted_cached_input_tokens: int = 0
    interrupted_output_tokens: int = 0
    processed_input_tokens: int = 0
    cached_input_tokens: int = 0
    generated_output_tokens: int = 0
    delivered_output_tokens: int = 0
    recompute_tokens: int = 0
    unbilled_tail_tokens: int = 0

    def plus(self, other: "ModelUsage") -> "ModelUsage":
        counts = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)[1:]}
        return ModelUsage(self.model_version, **counts)

    def as_json(self) -> dict[str, object]:
        return {"model": self.model_version, "generations": self.generations,
                "processedInputTokens": self.processed_input_tokens, "cachedInputTokens": self.cached_input_tokens,
                "generatedOutputTokens": self.generated_output_tokens,
                "deliveredOutputTokens": self.delivered_output_tokens,
                "billedInputTokens": self.billed_input_tokens,
                "billedCachedInputTokens": self.billed_cached_input_tokens,
                "billedOutputTokens": self.billed_output_tokens, "recomputeTokens": self.recompute_tokens,
                "unbilledTailTokens": self.unbilled_tail_tokens,
                "interrupted": {"generations": self.interrupted_generations,
                                "inputTokens": self.interrupted_input_tokens,
                                "cachedInputTokens": self.interrupted_cached_input_tokens,
                                "outputTokens": self.interrupted_output_tokens}}


def billed_totals(models: list[ModelUsage]) -> dict[str, int]:
    """Today's `totals` / bucket fields: billed figures summed over models."""
    return {"generations": sum(m.generations for m in models),
            "inputTokens": sum(m.billed_input_tokens for m in models),
            "cachedInputTokens": sum(m.billed_cached_input_tokens for m in models),
            "outputTokens": sum(m.billed_output_tokens for m in models)}


@dataclass(frozen=True)
class UsageReport:
    tenant_id: str
    window: UsageWindow
    buckets: dict[datetime, list[ModelUsage]] = field(default_factory=dict)  # bucket start -> per model

    def models(self) -> list[ModelUsage]:
        merged: dict[str, ModelUsage] = {}
        for models in self.buckets.values():
            for usage in models:
                known = merged.get(usage.model_version)
                merged[usage.model_version] = usage if known is None else known.plus(usage)
        return [merged[name] for name in sorted(merged)]

    def as_json(self) -> dict[str, object]:
        w = self.window
        key = w.granularity  # "hour" | "day": today's `hours` list keeps its name and fields
        return {"tenantId": self.tenant_id, "from": w.start.isoformat(), "to": w.end.isoformat(),
                "granularity": w.granularity, "model": w.model, "totals": billed_totals(self.models()),
                "models": [m.as_json() for m in self.models()],
                f"{key}s": [{key: start.isoformat(), **billed_totals(models), "models": [m.as_json() for m in models]}
                            for start, models in sorted(self.buckets.items())]}


def report_from(tenant_id: str, window: UsageWindow, rows: list[tuple]) -> UsageReport:
    """Rows of USAGE_SQL: (bucket, model version, then ModelUsage's counts in field order)."""
    buckets: dict[datetime, list[ModelUsage]] = {}
    for bucket, model, *counts in rows:
        buckets.setdefault(bucket.astimezone(UTC), []).append(ModelUsage(model, *(int(c) for c in counts)))
    return UsageReport(tenant_id, window, buckets)


def usage_params(tenant_id: str, window: UsageWindow) -> dict[str, object]:
    return {"unit": window.granularity, "tenant": tenant_id, "lower": window.lower, "upper": window.upper,
            "model": window.model}


USAGE_SQL = """
    SELECT date_trunc(%(unit)s, b.sealed_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', b.model_version,
           count(*), sum(b.billed_input_tokens), sum(b.billed_cached_input_tokens), sum(b.billed_output_tokens),
           count(*) FILTER (WHERE b.usage_label = 'interrupted'),
           COALESCE(sum(b.billed_input_tokens) FILTER (WHERE b.usage_label = 'interrupted'), 0),
           COALESCE(sum(b.billed_cached_input_tokens) FILTER (WHERE b.usage_label = 'interrupted'), 0),
           COALESCE(sum(b.billed_output_tokens) FILTER (WHERE b.usage_label = 'interrupted'), 0),
           COALESCE(sum(w.processed), 0), COALESCE(sum(w.cached), 0),
           COALESCE(sum(w.generated), 0) + COALESCE(sum(t.generated_output_tokens), 0),
           COALESCE(sum(sp.token_count), 0), COALESCE(sum(w.recompute), 0),
           COALESCE(sum(t.generated_output_tokens), 0)
    FROM billing_ledger b
    LEFT JOIN LATERAL (
        SELECT sum(processed_input_tokens) AS processed, sum(cached_input_tokens) AS cached,
               sum(generated_output_tokens) AS generated, sum(recompute_tokens) AS recompute
        FROM usage_watermarks WHERE generation_id = b.generation_id) w ON true
    LEFT JOIN usage_reconciliation t ON t.generation_id = b.generation_id AND t.epoch = b.epoch
         AND t.kind = 'unbilled_tail' AND t.report_seq = 0
    LEFT JOIN stream_progress sp ON sp.generation_id = b.generation_id AND sp.epoch = b.epoch
    WHERE b.tenant_id = %(tenant)s AND b.sealed_at >= %(lower)s AND b.sealed_at < %(upper)s
      AND (%(model)s::text IS NULL OR b.model_version = %(model)s OR split_part(b.model_version, '@', 1) = %(model)s)
    GROUP BY 1, 2 ORDER BY 1, 2
    """
