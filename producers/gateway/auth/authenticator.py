"""Authentication of API keys: the gateway's key directory first, then a bounded TTL cache in front of Postgres,
failures rate-limited per address.

    presented key ─▶ key directory (llm.tenants in memory, key_directory.py): live ─▶ its tenant
                  └▶ unknown to the directory and cached as valid ─▶ its tenant
                  └▶ address out of attempts? ─▶ 429 auth_rate_limited (Retry-After)
                  └▶ spend one attempt ─▶ revoked / ambiguous in the directory ─▶ 401
                                       └▶ unknown: cached miss, or Postgres lookup (pooled, then cached)
                                          └▶ valid: attempt given back; none: 401;
                                             database down: 503 database_unavailable, attempt given back

The directory reads the log, so keys keep working while the `tenants` projection is
dropped and rebuilt; Postgres answers only for hashes the directory has not read
(yet): a tenant created a moment ago, which `create_tenant` has already projected,
or every key while the directory catches up after start. A flood of random keys
from one address therefore costs at most its failure budget of queries per window,
and no more memory than the cache's bound, while known keys keep working, from any
address. The address is the connection's peer (`request.client.host`): behind a
proxy that is the proxy, so put the limit there or give each client its own path.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from cachetools import LRUCache, TTLCache

from plumbing.settings import Settings
from producers.api_keys import could_be_key, hash_api_key
from producers.gateway.auth.key_directory import KeyDirectory, Refused
from producers.gateway.database import GatewayDatabase, Principal
from producers.gateway.errors import ApiError, DatabaseUnavailable


@dataclass
class Bucket:
    tokens: float
    at: float


class FailureLimiter:
    """A token bucket of `per_minute` failed authentications per address (the burst is the same number),
    over at most `addresses` addresses (the least recently failing forgotten first)."""

    def __init__(self, per_minute: int, addresses: int) -> None:
        self.capacity = float(per_minute)
        self.refill_per_s = per_minute / 60.0
        self.buckets: LRUCache[str, Bucket] = LRUCache(maxsize=addresses)

    def _bucket(self, address: str, now: float) -> Bucket:
        bucket = self.buckets.get(address)
        if bucket is None:
            return Bucket(self.capacity, now)
        bucket.tokens = min(self.capacity, bucket.tokens + (now - bucket.at) * self.refill_per_s)
        bucket.at = now
        return bucket

    def take(self, address: str, now: float) -> int | None:
        """Spend one attempt of `address` (None), or the ms until it has one again (nothing spent)."""
        bucket = self._bucket(address, now)
        if bucket.tokens < 1:
            return max(1, int((1 - bucket.tokens) / self.refill_per_s * 1000))
        bucket.tokens -= 1
        self.buckets[address] = bucket
        return None

    def refund(self, address: str) -> None:
        """Give back an attempt that turned out to authenticate."""
        bucket = self.buckets.get(address)
        if bucket is not None:
            bucket.tokens = min(self.capacity, bucket.tokens + 1)


class Authenticator:
    def __init__(self, db: GatewayDatabase, directory: KeyDirectory, settings: Settings) -> None:
        self.db = db
        self.directory = directory
        self.cache: TTLCache[str, Principal | None] = TTLCache(maxsize=settings.gateway_auth_cache_entries,
                                                               ttl=settings.gateway_auth_cache_s)
        self.failures = FailureLimiter(settings.gateway_auth_failures_per_minute,
                                       settings.gateway_auth_cache_entries)
        self.lookups = 0  # Postgres queries made (a test and an operator can see what a flood cost)

    async def principal(self, presented: str | None, address: str | None) -> Principal:
        """The key's tenant; ApiError 401 for a missing, unknown or revoked key, 429 while `address` is over its
        failure budget, 503 when Postgres has to answer and cannot. A key live in the directory or cached as
        valid costs nothing; anything else spends one attempt of the address before its lookup (so concurrent
        floods are bounded too), given back when the key is valid or the database failed."""
        key_hash = hash_api_key(presented) if could_be_key(presented) else None
        known = self.directory.lookup(key_hash) if key_hash is not None else None
        if isinstance(known, Principal):
            return known
        principal = self.cache.get(key_hash) if key_hash is not None and known is None else None
        if principal is not None:
            return principal
        address = address or "unknown"
        retry_ms = self.failures.take(address, time.monotonic())
        if retry_ms is not None:
            raise ApiError(429, "auth_rate_limited", "too many failed authentications from this address",
                           {"reason": "auth_failures"}, retry_ms)
        if key_hash is not None and not isinstance(known, Refused) and key_hash not in self.cache:
            principal = await self._looked_up(key_hash, address)
        if principal is None:
            raise ApiError(401, "unauthorized", "a valid API key is required (Authorization: Bearer <key>)")
        self.failures.refund(address)
        return principal

    async def _looked_up(self, key_hash: str, address: str) -> Principal | None:
        """Postgres's answer for a hash the directory does not know, cached (hits and misses alike)."""
        self.lookups += 1
        try:
            principal = await self.db.principal_of_key(key_hash)
        except DatabaseUnavailable:
            self.failures.refund(address)  # the database failed, not the caller's key
            raise
        self.cache[key_hash] = principal
        return principal


def presented_key(headers, query_key: str | None = None) -> str | None:
    """The key of `Authorization: Bearer`, else `X-Api-Key`, else a WebSocket's `?api_key=`."""
    header = headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return headers.get("x-api-key") or query_key
