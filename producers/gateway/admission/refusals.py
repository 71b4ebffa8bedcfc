"""The gateway remembers the controller's last `no_capacity` per model and tier for a short while.

    controller: 503 no_capacity, Retry-After R  ─▶  for min(R, HOLD_S): the same model and tier is answered
                                                    503 here, Retry-After the time left, no command published

A client that ignores Retry-After (guidellm resends at once) otherwise turns an overload into a refusal
loop: at 16 streams on 2 cores one run made 1,894 refusals in 50 s, each a command through the broker, a
controller transaction and a reply, and the platform's tok/s fell below its value at 8 streams. Within the
hold the controller's answer would be the same (the worker's queue drains at step speed, and its Retry-After
says when the wait fits again); the hold is short so capacity that frees is seen again soon. A refusal of
no_capacity is about the workers, not the tenant, so it holds for every tenant alike.
"""
from __future__ import annotations

import time

# The longest a refusal is repeated without asking the controller again.
HOLD_S = 0.5


class CapacityRefusals:
    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.until: dict[tuple[str, str], float] = {}  # (model as asked, tier) -> monotonic end of the hold
        self.repeated = 0

    def observe(self, model: str, tier: str, error_code: str | None, retry_after_ms: int | None) -> None:
        if error_code != "no_capacity":
            return
        hold_s = min((retry_after_ms or 0) / 1000, HOLD_S)
        if hold_s > 0:
            self.until[(model, tier)] = self.clock() + hold_s

    def admitted(self, model: str, tier: str) -> None:
        """An admission proves there is room again: the hold ends."""
        self.until.pop((model, tier), None)

    def retry_after_ms(self, model: str, tier: str) -> int | None:
        """The hold left on this model and tier in ms (None: ask the controller)."""
        until = self.until.get((model, tier))
        if until is None:
            return None
        left = until - self.clock()
        if left <= 0:
            del self.until[(model, tier)]
            return None
        self.repeated += 1
        return max(1, round(left * 1000))
