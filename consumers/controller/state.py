"""The controller's state for the tenant partitions it owns, rebuilt from the changelog.

    PartitionState ── tenants: tenant id ─▶ TenantState
                   └─ owners:  generation id ─▶ (tenant id, request id)

    TenantState ── generations: request id ─▶ IdentityRecorded (latest)
                └─ rate: unix second ─▶ tokens charged (the token-rate window)

Tokens in flight and concurrency are derived from the live generations, so a
rebuild from the changelog reproduces them exactly.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from schemas.changelog import IdentityRecorded, TenantBudgetState

RATE_WINDOW_S = 60
LIVE = ("active", "canceling")


@dataclass
class TenantState:
    tenant_id: str
    generations: dict[str, IdentityRecorded] = field(default_factory=dict)
    rate: dict[int, int] = field(default_factory=dict)

    def live(self) -> Iterator[IdentityRecorded]:
        return (g for g in self.generations.values() if g.status in LIVE)

    @property
    def tokens_in_flight(self) -> int:
        return sum(g.reserved_tokens for g in self.live())

    @property
    def queued_tokens(self) -> int:
        return sum(g.reserved_tokens for g in self.live() if g.queued)

    @property
    def concurrency(self) -> int:
        return sum(1 for _ in self.live())

    def tokens_in_window(self, now_s: int) -> int:
        self.trim_rate(now_s)
        return max(0, sum(self.rate.values()))

    def trim_rate(self, now_s: int) -> None:
        for second in [s for s in self.rate if s <= now_s - RATE_WINDOW_S]:
            del self.rate[second]

    def charge(self, now_s: int, tokens: int) -> None:
        self.trim_rate(now_s)
        self.rate[now_s] = self.rate.get(now_s, 0) + tokens

    def seconds_until_room(self, now_s: int, needed: int, limit: int) -> int:
        """Seconds until `needed` more tokens fit the per-minute window (0: they fit now)."""
        total = self.tokens_in_window(now_s)
        if total + needed <= limit:
            return 0
        for second in sorted(self.rate):
            total -= self.rate[second]
            if total + needed <= limit:
                return max(1, second + RATE_WINDOW_S - now_s)
        return RATE_WINDOW_S

    def budget_record(self, now_s: int, plane: str | None = None) -> TenantBudgetState:
        self.trim_rate(now_s)
        return TenantBudgetState(plane=plane, tenant_id=self.tenant_id, tokens_in_flight=self.tokens_in_flight,
                                 concurrency=self.concurrency, queued_tokens=self.queued_tokens,
                                 rate_buckets=tuple(sorted(self.rate.items())))


@dataclass
class PartitionState:
    """All tenants of one `llm.commands` partition."""

    partition: int
    tenants: dict[str, TenantState] = field(default_factory=dict)
    owners: dict[str, tuple[str, str]] = field(default_factory=dict)

    def tenant(self, tenant_id: str) -> TenantState:
        if tenant_id not in self.tenants:
            self.tenants[tenant_id] = TenantState(tenant_id)
        return self.tenants[tenant_id]

    def record(self, generation: IdentityRecorded) -> None:
        self.tenant(generation.tenant_id).generations[generation.request_id] = generation
        self.owners[generation.generation_id] = (generation.tenant_id, generation.request_id)

    def find(self, tenant_id: str, generation_id: str) -> IdentityRecorded | None:
        """The generation if it belongs to this tenant; another tenant's id is as unknown as a made-up one."""
        owner = self.owners.get(generation_id)
        if owner is None or owner[0] != tenant_id:
            return None
        return self.tenants[owner[0]].generations[owner[1]]

    def live(self) -> Iterator[IdentityRecorded]:
        for tenant in self.tenants.values():
            yield from tenant.live()

    def apply_changelog(self, record: IdentityRecorded | TenantBudgetState) -> None:
        if isinstance(record, IdentityRecorded):
            self.record(record)
        else:
            self.tenant(record.tenant_id).rate = dict(record.rate_buckets)
