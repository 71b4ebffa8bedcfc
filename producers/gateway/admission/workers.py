"""The gateway's view of the workers (`llm.workers`): refuse at once what no worker could take.

The controller stays the authority for admission. This only answers the one
case it would certainly refuse — no live worker of this control plane serves
any version the request may run on, or none has a pool that could ever hold
it — without the controller transaction a refusal otherwise costs. Under a
storm of immediate retries against a version nobody serves, those refusals
never reach Kafka.

A request id this tenant already used is never refused here: its repeat must
answer the existing generation (200) or a conflict (409), which only the
controller knows.

Certainty is the rule, so a worker counts here until it has been silent for
EARLY_REFUSAL_LEASES leases, not one: a worker whose heartbeat is a moment
late (its process starved of CPU) may be live again by the time the controller
decides, and the controller judges that itself. A first request of a test
session got this 503 on a loaded 2-core machine from a worker that was serving.
A worker that said it stopped or is draining stops counting at once.
"""
from __future__ import annotations

from collections.abc import Iterable

from schemas.registry_events import WorkerHeartbeat

EARLY_REFUSAL_LEASES = 3


class WorkerBoard:
    def __init__(self, plane: str) -> None:
        self.plane = plane
        self.latest: dict[str, WorkerHeartbeat] = {}

    def observe(self, heartbeat: WorkerHeartbeat) -> None:
        known = self.latest.get(heartbeat.worker_id)
        if known is None or heartbeat.occurred_at >= known.occurred_at:
            self.latest[heartbeat.worker_id] = heartbeat

    def is_live(self, heartbeat: WorkerHeartbeat, now: float, read_through: float | None = None,
                leases: int = 1) -> bool:
        """Alive, not draining, of this plane, and within `leases` leases as of `now` or of `read_through` (the
        workers follower's Follower.read_through), whichever is earlier."""
        return (heartbeat.alive and not heartbeat.draining and heartbeat.plane in (None, self.plane)
                and heartbeat.within_lease(now, read_through, leases))

    def could_serve(self, versions: Iterable[str], total_tokens: int, now: float,
                    read_through: float | None = None) -> bool:
        """Some worker that may be live serves one of `versions` with a pool of at least `total_tokens`."""
        wanted = set(versions)
        return any(self.is_live(hb, now, read_through, EARLY_REFUSAL_LEASES)
                   and wanted.intersection(hb.model_versions)
                   and hb.total_blocks * hb.block_size >= total_tokens for hb in self.latest.values())

    def freshest_age_s(self, versions: Iterable[str], now: float) -> float | None:
        """Seconds since the newest heartbeat of a worker serving one of `versions` (None: none heard)."""
        wanted = set(versions)
        stamps = [hb.occurred_at.timestamp() for hb in self.latest.values() if wanted.intersection(hb.model_versions)]
        return round(now - max(stamps), 2) if stamps else None
