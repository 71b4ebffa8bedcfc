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
"""
from __future__ import annotations

from collections.abc import Iterable

from schemas.registry_events import WorkerHeartbeat


class WorkerBoard:
    def __init__(self, plane: str) -> None:
        self.plane = plane
        self.latest: dict[str, WorkerHeartbeat] = {}

    def observe(self, heartbeat: WorkerHeartbeat) -> None:
        known = self.latest.get(heartbeat.worker_id)
        if known is None or heartbeat.occurred_at >= known.occurred_at:
            self.latest[heartbeat.worker_id] = heartbeat

    def is_live(self, heartbeat: WorkerHeartbeat, now: float, read_through: float | None = None) -> bool:
        """Alive, not draining, of this plane, and within its lease as of `now` or of `read_through` (the
        workers follower's Follower.read_through), whichever is earlier."""
        return (heartbeat.alive and not heartbeat.draining and heartbeat.plane in (None, self.plane)
                and heartbeat.within_lease(now, read_through))

    def could_serve(self, versions: Iterable[str], total_tokens: int, now: float,
                    read_through: float | None = None) -> bool:
        """Some live worker serves one of `versions` with a pool of at least `total_tokens`."""
        wanted = set(versions)
        return any(self.is_live(hb, now, read_through) and wanted.intersection(hb.model_versions)
                   and hb.total_blocks * hb.block_size >= total_tokens for hb in self.latest.values())
