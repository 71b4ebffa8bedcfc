"""The gateway's own map of API key hashes to tenants, followed from `llm.tenants` into memory.

    llm.tenants (compacted) ──Follower, from the beginning──▶ ApiKeyIndex ──▶ Authenticator (authenticator.py)
                                                                            └─ unknown here: Postgres

The `tenants` projection can be dropped and rebuilt under running gateways
(issue 16's chaos run): keys read from it would answer 401 until the projector
had replayed `llm.tenants`. The index reads the log itself and gives what the
projection gives (`projections/tenants.py`): a tenant's latest TenantRegistered
makes its key live and revokes its previous keys (for good: a revoked key
registered again stays revoked, as its row does), and a hash live for two
tenants authenticates nobody (as `producers.api_keys.authenticate`). It holds
hashes and limits only, never a key.
"""
from __future__ import annotations

import asyncio
from contextlib import suppress
from dataclasses import dataclass
from typing import Literal

from plumbing.kafka.clients import Kafka
from plumbing.kafka.follower import REGISTRY_POLL_MS, Follower
from producers.gateway.database import Principal
from schemas.registry_events import TenantRegistered
from schemas.topics import TENANTS


@dataclass(frozen=True)
class Refused:
    """A hash the index knows that authenticates nobody."""

    reason: Literal["revoked", "ambiguous"]


class ApiKeyIndex:
    """Which tenants each registered hash is live for, from every TenantRegistered in log order."""

    def __init__(self) -> None:
        self.principals: dict[str, Principal] = {}  # tenant -> its latest limits
        self.current: dict[str, str] = {}  # tenant -> the hash of its latest registration
        self.revoked: dict[str, set[str]] = {}  # tenant -> hashes a later registration of it replaced
        self.holders: dict[str, set[str]] = {}  # every hash ever registered -> the tenants it is live for

    def observe(self, event: TenantRegistered) -> None:
        tenant, key_hash = event.tenant_id, event.api_key_hash
        previous = self.current.get(tenant)
        if previous is not None and previous != key_hash:
            self.revoked.setdefault(tenant, set()).add(previous)
            self.holders[previous].discard(tenant)
        self.current[tenant] = key_hash
        self.principals[tenant] = Principal(tenant, event.limits.max_tokens_in_flight, event.limits.tokens_per_minute)
        holders = self.holders.setdefault(key_hash, set())
        if key_hash not in self.revoked.get(tenant, ()):
            holders.add(tenant)

    def lookup(self, key_hash: str) -> Principal | Refused | None:
        """The tenant the hash authenticates, Refused for a known hash that authenticates nobody, None if unknown."""
        holders = self.holders.get(key_hash)
        if holders is None:
            return None
        if len(holders) == 1:
            return self.principals[next(iter(holders))]
        return Refused("ambiguous" if holders else "revoked")


class KeyDirectory:
    """`llm.tenants` followed into an ApiKeyIndex for as long as the gateway runs.

    It answers only once it has read up to the end offsets seen at start: a tenant
    read halfway could still show a key it has since replaced as live. Until then,
    and if following ever stops, every key is unknown here and goes to Postgres.
    """

    def __init__(self, kafka: Kafka, client_id: str = "gateway-tenants") -> None:
        self.index = ApiKeyIndex()
        self.follower = Follower(kafka, [TENANTS], self._on_record, client_id=client_id,
                                 long_poll_ms=REGISTRY_POLL_MS)
        self._task: asyncio.Task | None = None

    def _on_record(self, _topic: str, event) -> None:
        if isinstance(event, TenantRegistered):
            self.index.observe(event)

    async def start(self) -> None:
        await self.follower.start()
        self._task = asyncio.create_task(self.follower.run(), name="gateway-tenants")

    @property
    def caught_up(self) -> bool:
        return self.follower.caught_up.is_set() and self._task is not None and not self._task.done()

    def lookup(self, key_hash: str) -> Principal | Refused | None:
        """As ApiKeyIndex.lookup once caught up; None (unknown) before."""
        return self.index.lookup(key_hash) if self.caught_up else None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        await self.follower.stop()
