"""Read-side queries over the projections, for the gateway (no HTTP here)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg


@dataclass(frozen=True)
class UsageHour:
    hour: datetime
    generations: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class UsageSummary:
    tenant_id: str
    start: datetime
    end: datetime
    hours: tuple[UsageHour, ...]

    @property
    def totals(self) -> dict[str, int]:
        return {
            "generations": sum(h.generations for h in self.hours),
            "inputTokens": sum(h.input_tokens for h in self.hours),
            "cachedInputTokens": sum(h.cached_input_tokens for h in self.hours),
            "outputTokens": sum(h.output_tokens for h in self.hours),
        }

    def as_json(self) -> dict[str, object]:
        return {
            "tenantId": self.tenant_id, "from": self.start.isoformat(), "to": self.end.isoformat(),
            "totals": self.totals,
            "hours": [{"hour": h.hour.isoformat(), "generations": h.generations, "inputTokens": h.input_tokens,
                       "cachedInputTokens": h.cached_input_tokens, "outputTokens": h.output_tokens}
                      for h in self.hours],
        }


# Parameters: tenant id, start, end. Buckets whose hour starts in [hour of start, end).
TENANT_USAGE_SQL = (
    "SELECT hour, generations, input_tokens, cached_input_tokens, output_tokens FROM tenant_usage_hourly "
    "WHERE tenant_id = %s AND hour >= date_trunc('hour', %s::timestamptz AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' "
    "AND hour < %s ORDER BY hour")


def summarize(tenant_id: str, start: datetime, end: datetime, rows: list[tuple]) -> UsageSummary:
    return UsageSummary(tenant_id, start, end, tuple(UsageHour(*row) for row in rows))


def tenant_usage(conn: psycopg.Connection, tenant_id: str, start: datetime, end: datetime) -> UsageSummary:
    """Sealed (billed) usage of one tenant in hourly buckets (sync form; the gateway runs the same SQL async)."""
    return summarize(tenant_id, start, end, conn.execute(TENANT_USAGE_SQL, (tenant_id, start, end)).fetchall())


# Parameter: a list of topics. Per (topic, partition), the offset every projection of it has applied up to.
PROJECTED_OFFSETS_SQL = ("SELECT topic, partition, min(next_offset) FROM projection_offsets WHERE topic = ANY(%s) "
                         "GROUP BY topic, partition")
