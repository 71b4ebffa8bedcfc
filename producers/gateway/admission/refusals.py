"""The gateway remembers the controller's last `no_capacity` per model and tier, and answers it slowly.

    controller: 503 no_capacity, Retry-After R  ─▶  answered after min(R, HOLD_S) (a tarpit), and for that
                                                    hold every request for the same model and tier waits out
                                                    the hold and is answered 503 too, with no command published

A client that ignores Retry-After (guidellm resends at once) otherwise turns an overload into a refusal
loop on the very cores the engine needs: at 16 streams on 2 cores one run made 1,894 refusals in 50 s, each a
command through the broker, a controller transaction and a reply, and tok/s fell from 51 at 8 streams to 41.
Answering the repeats at once made it worse: 10,546 refusals in 50 s and 10 tok/s, the client and the
gateway's HTTP work eating the engine's CPU. Held, a refused stream asks at most about twice a second, and
only the first request after a hold reaches the controller. Within the hold the controller's answer would be
the same (the worker's queue drains at step speed; its Retry-After says when the wait fits again), and the
hold is short, so capacity that frees is seen again soon. A no_capacity is about the workers, not the tenant:
it holds for every tenant alike, and the wait costs the server a timer, not a core.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

# The longest a refusal is held (and repeated) without asking the controller again.
HOLD_S = 0.5


@dataclass(frozen=True)
class Hold:
    until: float  # monotonic end of the hold
    retry_until: float  # monotonic time the controller's Retry-After pointed at


class CapacityRefusals:
    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.holds: dict[tuple[str, str], Hold] = {}  # (model as asked, tier) -> the hold
        self.repeated = 0

    def observe(self, model: str, tier: str, error_code: str | None, retry_after_ms: int | None) -> float:
        """Record the controller's refusal; the seconds its answer is held back (0: not a capacity refusal)."""
        if error_code != "no_capacity" or not retry_after_ms:
            return 0.0
        now, retry_s = self.clock(), retry_after_ms / 1000
        hold_s = min(retry_s, HOLD_S)
        self.holds[(model, tier)] = Hold(now + hold_s, now + retry_s)
        return hold_s

    def admitted(self, model: str, tier: str) -> None:
        """An admission proves there is room again: the hold ends."""
        self.holds.pop((model, tier), None)

    def held(self, model: str, tier: str) -> tuple[float, int] | None:
        """(seconds to wait out the hold, Retry-After ms from its end) while one holds; None: ask the controller."""
        hold = self.holds.get((model, tier))
        if hold is None:
            return None
        now = self.clock()
        if hold.until <= now:
            del self.holds[(model, tier)]
            return None
        self.repeated += 1
        return hold.until - now, max(1, round((hold.retry_until - hold.until) * 1000))
