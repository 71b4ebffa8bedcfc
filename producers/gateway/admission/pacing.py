"""Batch admissions at a bounded rate per gateway, tenants taking turns.

A batch client waits hours for its results, not seconds for its 201, but the admission of a burst costs the
whole machine at once: 1,000 batch POSTs cost the gateway, the controller and the broker about 0.7 of a core
for 5-9 s, and the chats sent in that instant waited 5 s for their first token on a worker that runs at nice
10 (decision 0021). A gateway therefore hands batch requests to the controller at most `rate_per_s` a second
(`LEDGERLM_GATEWAY_BATCH_ADMISSIONS_PER_S`; 0 turns pacing off), up to `burst` at once after a quiet spell.
Waiting requests are released one tenant at a time in turn, so one tenant's burst delays another tenant's
batch request by a turn, not by the whole burst. Interactive requests never wait here.

A request whose client leaves while it waits gives its turn up (its task is cancelled) and costs nothing.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque

WHOLE = 1 - 1e-9  # a turn's worth of tokens, short of float rounding (0.1 s at 10/s is 0.99999... of a turn)


class BatchPacer:
    def __init__(self, rate_per_s: float, burst: int, clock=time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self.clock = clock
        self.tokens = float(self.burst)
        self.stamp = clock()
        self.waiting: dict[str, deque[asyncio.Future]] = {}  # tenant -> its requests in arrival order
        self.turns: deque[str] = deque()  # tenants with a request waiting, in turn
        self.timer: asyncio.TimerHandle | None = None

    @property
    def queued(self) -> int:
        return sum(len(futures) for futures in self.waiting.values())

    async def turn(self, tenant_id: str) -> None:
        """Return when this tenant's batch request may go to the controller."""
        if self.rate_per_s <= 0:
            return
        self._refill()
        if not self.turns and self.tokens >= WHOLE:
            self.tokens -= 1
            return
        future = asyncio.get_running_loop().create_future()
        if tenant_id not in self.waiting:
            self.waiting[tenant_id] = deque()
            self.turns.append(tenant_id)
        self.waiting[tenant_id].append(future)
        self._schedule()
        await future  # a cancelled wait leaves its future behind, done: `_release` skips it

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate_per_s)
        self.stamp = now

    def _schedule(self) -> None:
        if self.timer is None and self.turns:
            delay = max(0.0, (1 - self.tokens) / self.rate_per_s)
            self.timer = asyncio.get_running_loop().call_later(delay, self._release)

    def _release(self) -> None:
        if self.timer is not None:
            self.timer.cancel()  # called early (its own timer calls it on time)
            self.timer = None
        self._refill()
        while self.turns and self.tokens >= WHOLE:
            tenant_id = self.turns.popleft()
            futures = self.waiting[tenant_id]
            future = futures.popleft()
            if futures:
                self.turns.append(tenant_id)
            else:
                del self.waiting[tenant_id]
            if not future.done():  # its client left meanwhile: the turn goes to the next
                future.set_result(None)
                self.tokens -= 1
        self._schedule()
