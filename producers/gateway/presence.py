"""Who is watching which generation on this gateway, for the disconnect policy.

An interactive generation whose every subscriber left, and none came back
within `disconnect_grace_s`, is cancelled: nobody will read the rest, so the
tenant should not pay for it. Batch-tier generations are never cancelled this
way, and a generation nobody ever subscribed to (a plain POST) is not either.

Presence is per gateway. With partition-aware routing (README, "Streams and
resume") every subscriber of one generation lands on the same gateway, so
this gateway's count is the whole count; behind a plain round-robin balancer
a subscriber on another gateway would not be seen, and the grace must cover
a client's reconnect time.
"""
from __future__ import annotations

import time


class Presence:
    def __init__(self) -> None:
        self.subscribers: dict[str, int] = {}
        self.detached_at: dict[str, float] = {}

    def attach(self, generation_id: str) -> None:
        self.subscribers[generation_id] = self.subscribers.get(generation_id, 0) + 1
        self.detached_at.pop(generation_id, None)

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
            self.detached_at[generation_id] = time.monotonic()

    def due(self, grace_s: float) -> list[str]:
        """Generations unwatched for at least `grace_s`; each is returned once."""
        now = time.monotonic()
        expired = [g for g, since in self.detached_at.items() if now - since >= grace_s]
        for generation_id in expired:
            del self.detached_at[generation_id]
        return expired
