"""Who is watching which generation, on this gateway and on the others, for the disconnect policy.

An interactive generation whose every subscriber left, and none came back
within `disconnect_grace_s` on any gateway, is cancelled: nobody will read the
rest, so the tenant should not pay for it. Batch-tier generations are never
cancelled this way, and a generation nobody ever subscribed to (a plain POST)
is not either.

    gateway A: last subscriber leaves ─▶ WatchersChanged(A, 0) ─▶ llm.presence ─▶ every gateway
    client reconnects to gateway B     ─▶ WatchersChanged(B, 1) ─▶ llm.presence ─▶ A drops its grace

Each gateway publishes only its transitions (0 -> 1 and back), two small
records per stream, and reads every gateway's. A gateway decides only for a
generation whose last local subscriber left at least the grace ago, and only
when no gateway reports a watcher now and none reports a later departure (that
gateway decides instead): exactly one gateway cancels, and none while a client
watches anywhere. Presence is not derived from the token stream's partition
owner, so it does not move, or get lost, when partitions move between gateways.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from schemas.presence import WatchersChanged

FORGET_S = 3600.0  # another gateway's report this old (its topic's retention) is dropped


@dataclass(frozen=True)
class Report:
    watchers: int
    at: float  # wall clock of the change (seconds)


class Presence:
    def __init__(self, gateway_id: str = "local", clock=time.time) -> None:
        self.gateway_id = gateway_id
        self.clock = clock
        self.subscribers: dict[str, int] = {}
        self.detached_at: dict[str, float] = {}
        self.elsewhere: dict[str, dict[str, Report]] = {}
        self.outbox: asyncio.Queue[WatchersChanged] = asyncio.Queue()

    def attach(self, generation_id: str) -> None:
        count = self.subscribers.get(generation_id, 0) + 1
        self.subscribers[generation_id] = count
        self.detached_at.pop(generation_id, None)
        if count == 1:
            self._publish(generation_id, 1)

    def detach(self, generation_id: str, ended: bool) -> None:
        """A subscriber left; `ended` when it had received the final event (nothing left to cancel)."""
        left = self.subscribers.get(generation_id, 1) - 1
        if left > 0:
            self.subscribers[generation_id] = left
            return
        self.subscribers.pop(generation_id, None)
        if ended:
            self.detached_at.pop(generation_id, None)
        else:
            self.detached_at[generation_id] = self.clock()
        self._publish(generation_id, 0, ended)

    def _publish(self, generation_id: str, watchers: int, ended: bool = False) -> None:
        self.outbox.put_nowait(WatchersChanged(generation_id=generation_id, gateway_id=self.gateway_id,
                                               watchers=watchers, ended=ended))

    def observe(self, event: WatchersChanged) -> None:
        """Another gateway's change (our own records come back too: ignored)."""
        if event.gateway_id != self.gateway_id:
            reports = self.elsewhere.setdefault(event.generation_id, {})
            reports[event.gateway_id] = Report(event.watchers, event.occurred_at.timestamp())

    def watched_elsewhere(self, generation_id: str, since: float) -> bool:
        """Some gateway has a subscriber now, or lost its last one after `since` (so it decides, not us)."""
        reports = self.elsewhere.get(generation_id, {})
        return any(r.watchers > 0 or r.at > since for r in reports.values())

    def due(self, grace_s: float) -> list[str]:
        """Generations unwatched everywhere for at least `grace_s` that this gateway decides; each returned once."""
        now = self.clock()
        expired = []
        for generation_id, since in list(self.detached_at.items()):
            if self.watched_elsewhere(generation_id, since):
                del self.detached_at[generation_id]  # a watcher elsewhere: it decides when it leaves
            elif now - since >= grace_s:
                del self.detached_at[generation_id]
                expired.append(generation_id)
        self._forget(now)
        return expired

    def _forget(self, now: float) -> None:
        for generation_id, reports in list(self.elsewhere.items()):
            if all(r.watchers == 0 and now - r.at > FORGET_S for r in reports.values()):
                del self.elsewhere[generation_id]
