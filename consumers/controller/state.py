"""The controller's state for the tenant partitions it owns, rebuilt from the changelog.

    PartitionState ── tenants: tenant id ─▶ TenantState
                   ├─ owners:  generation id ─▶ (tenant id, request id)
                   ├─ live:    generation id ─▶ (tenant id, request id)   active or canceling only
                   ├─ ending:  heap of (ended at, generation id)          identities due to expire
                   └─ held:    generation id ─▶ HeldAttempt                 batch work not yet dispatched,
                                                                             oldest first

    TenantState ── generations: request id ─▶ IdentityRecorded (latest)
                ├─ tokens_in_flight, concurrency, queued_tokens           counters over its live generations
                └─ rate: unix second ─▶ tokens charged (the token-rate window)

Every change of a generation goes through `PartitionState.record`, which takes
the old record's share out of the tenant's counters and adds the new one's, so
a submit and a lease check cost O(1) per tenant and O(live) per partition, not
a scan of every request id ever seen. The counters are a function of the
records alone, so a rebuild from the changelog reproduces them exactly
(`TenantState.recount` is the scan they must always equal).
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from schemas.changelog import HeldAttempt, IdentityRecorded, TenantBudgetState, held_of_key, identity_of_key

RATE_WINDOW_S = 60
LIVE = ("active", "canceling")


@dataclass(frozen=True)
class Budget:
    tokens_in_flight: int
    concurrency: int
    queued_tokens: int


@dataclass
class TenantState:
    tenant_id: str
    generations: dict[str, IdentityRecorded] = field(default_factory=dict)
    rate: dict[int, int] = field(default_factory=dict)
    tokens_in_flight: int = 0
    concurrency: int = 0
    queued_tokens: int = 0

    def count(self, gen: IdentityRecorded, sign: int) -> None:
        """Add (+1) or take out (-1) one record's share of the live budget."""
        if gen.status not in LIVE:
            return
        self.tokens_in_flight += sign * gen.reserved_tokens
        self.concurrency += sign
        if gen.queued:
            self.queued_tokens += sign * gen.reserved_tokens

    def budget(self) -> Budget:
        return Budget(self.tokens_in_flight, self.concurrency, self.queued_tokens)

    def recount(self) -> Budget:
        """The counters recomputed by scanning every record (for checks; the counters are what runs)."""
        live = [g for g in self.generations.values() if g.status in LIVE]
        return Budget(sum(g.reserved_tokens for g in live), len(live), sum(g.reserved_tokens for g in live if g.queued))

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


def ended_second(gen: IdentityRecorded) -> float:
    """When an ended generation ended; a record from before `ended_at` was kept falls back to its dispatch or
    admission time (earlier than its end: such a record expires early, never late)."""
    when = gen.ended_at or gen.dispatched_at
    if when is not None:
        return when.timestamp()
    return float(gen.admitted_s or 0)


@dataclass
class PartitionState:
    """All tenants of one `llm.commands` partition."""

    partition: int
    tenants: dict[str, TenantState] = field(default_factory=dict)
    owners: dict[str, tuple[str, str]] = field(default_factory=dict)
    live: dict[str, tuple[str, str]] = field(default_factory=dict)
    ending: list[tuple[float, str]] = field(default_factory=list)
    held: dict[str, HeldAttempt] = field(default_factory=dict)

    def tenant(self, tenant_id: str) -> TenantState:
        if tenant_id not in self.tenants:
            self.tenants[tenant_id] = TenantState(tenant_id)
        return self.tenants[tenant_id]

    def record(self, generation: IdentityRecorded) -> None:
        tenant = self.tenant(generation.tenant_id)
        old = tenant.generations.get(generation.request_id)
        if old is not None:
            tenant.count(old, -1)
            if old.generation_id != generation.generation_id:
                self.owners.pop(old.generation_id, None)
                self.live.pop(old.generation_id, None)
        tenant.generations[generation.request_id] = generation
        tenant.count(generation, +1)
        where = (generation.tenant_id, generation.request_id)
        self.owners[generation.generation_id] = where
        if generation.status in LIVE:
            self.live[generation.generation_id] = where
        else:
            self.live.pop(generation.generation_id, None)
            heapq.heappush(self.ending, (ended_second(generation), generation.generation_id))

    def forget(self, tenant_id: str, request_id: str) -> IdentityRecorded | None:
        """Drop one identity (its TTL passed, or a tombstone in the changelog says so)."""
        tenant = self.tenants.get(tenant_id)
        gen = tenant.generations.pop(request_id, None) if tenant is not None else None
        if gen is None:
            return None
        tenant.count(gen, -1)
        self.owners.pop(gen.generation_id, None)
        self.live.pop(gen.generation_id, None)
        if not tenant.generations and not tenant.rate:
            del self.tenants[tenant_id]
        return gen

    def expire(self, now: datetime, ttl_s: float, limit: int) -> list[IdentityRecorded]:
        """Forget at most `limit` ended generations whose end is `ttl_s` or more before `now`, oldest first.
        A live generation is never in the heap's due part; an entry whose record changed since is skipped."""
        due = now.timestamp() - ttl_s
        expired: list[IdentityRecorded] = []
        while self.ending and self.ending[0][0] <= due and len(expired) < limit:
            ended_s, generation_id = heapq.heappop(self.ending)
            where = self.owners.get(generation_id)
            if where is None:
                continue
            gen = self.tenants[where[0]].generations[where[1]]
            if gen.status in LIVE or ended_second(gen) != ended_s:
                continue
            expired.append(self.forget(*where))
        return expired

    def find(self, tenant_id: str, generation_id: str) -> IdentityRecorded | None:
        """The generation if it belongs to this tenant; another tenant's id is as unknown as a made-up one."""
        owner = self.owners.get(generation_id)
        if owner is None or owner[0] != tenant_id:
            return None
        return self.tenants[owner[0]].generations[owner[1]]

    def live_generations(self) -> Iterator[IdentityRecorded]:
        for tenant_id, request_id in list(self.live.values()):
            yield self.tenants[tenant_id].generations[request_id]

    def hold(self, attempt: HeldAttempt) -> None:
        self.held[attempt.generation_id] = attempt

    def release_held(self, generation_id: str) -> HeldAttempt | None:
        return self.held.pop(generation_id, None)

    def apply_changelog(self, record: IdentityRecorded | TenantBudgetState | HeldAttempt) -> None:
        if isinstance(record, IdentityRecorded):
            self.record(record)
        elif isinstance(record, HeldAttempt):
            self.hold(record)
        else:
            self.tenant(record.tenant_id).rate = dict(record.rate_buckets)

    def apply_tombstone(self, key: str, plane: str | None) -> None:
        """A null value in the changelog: the identity under `key` expired, or the held attempt under it left
        the queue (another plane's key: ignored)."""
        identity = identity_of_key(key, plane)
        if identity is not None:
            self.forget(*identity)
        held = held_of_key(key, plane)
        if held is not None:
            self.release_held(held)

    def order_held(self) -> None:
        """After a rebuild: the held queue oldest first, as it was before (records arrive in changelog order)."""
        self.held = dict(sorted(self.held.items(), key=lambda item: item[1].held_at))
