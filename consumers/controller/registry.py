"""The worker registry as the controller sees it: latest heartbeat per worker, plus recent dispatches.

A heartbeat is up to one interval old, so capacity the controller handed out
since then is held as `pending` and subtracted until a heartbeat sent well
after the dispatch has had the chance to count it. The worker still reserves
atomically and refuses when the estimate was wrong (DESIGN.md §4 step 3).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from schemas.registry_events import WorkerHeartbeat

# A dispatch is assumed to be reflected by heartbeats sent this long after it.
PENDING_GRACE_S = 0.5


@dataclass(frozen=True)
class WorkerChoice:
    worker_id: str
    room_tokens: int
    queue_s: float


@dataclass
class WorkerView:
    heartbeat: WorkerHeartbeat
    pending: dict[str, tuple[int, float]] = field(default_factory=dict)  # generation id -> (tokens, at)

    @property
    def capacity_tokens(self) -> int:
        return self.heartbeat.total_blocks * self.heartbeat.block_size

    @property
    def room_tokens(self) -> int:
        free = self.heartbeat.free_blocks * self.heartbeat.block_size
        return free - sum(tokens for tokens, _ in self.pending.values())


class WorkerRegistry:
    def __init__(self) -> None:
        self.workers: dict[str, WorkerView] = {}

    def observe(self, heartbeat: WorkerHeartbeat) -> None:
        view = self.workers.get(heartbeat.worker_id)
        if view is None or heartbeat.occurred_at >= view.heartbeat.occurred_at:
            if view is None:
                view = self.workers[heartbeat.worker_id] = WorkerView(heartbeat)
            view.heartbeat = heartbeat
            sent = heartbeat.occurred_at.timestamp()
            for gen_id in [g for g, (_, at) in view.pending.items() if at < sent - PENDING_GRACE_S]:
                del view.pending[gen_id]

    def has_fenced(self, worker_id: str, generation_id: str, epoch: int | None) -> bool:
        """The worker's latest heartbeat says it gave this attempt up (self-fenced)."""
        view = self.workers.get(worker_id)
        return view is not None and f"{generation_id}:{epoch}" in view.heartbeat.fenced

    def is_live(self, worker_id: str, now: float) -> bool:
        view = self.workers.get(worker_id)
        if view is None or not view.heartbeat.alive:
            return False
        return now - view.heartbeat.occurred_at.timestamp() <= view.heartbeat.lease_ms / 1000

    def choose(self, model_version: str, need_tokens: int, allowance_s: float, decode_tokens_per_s: float,
               now: float, exclude: frozenset[str] = frozenset(), may_wait: bool = False) -> WorkerChoice | None:
        """The ready worker with the version and the most room whose predicted queue time fits the allowance.

        Without room, an attempt waits on the worker for the KV it lacks (plus the work queued there) to
        drain at `decode_tokens_per_s`; only attempts that `may_wait` (batch tier) are routed so.
        """
        best: WorkerChoice | None = None
        for worker_id, view in self.workers.items():
            hb = view.heartbeat
            if (worker_id in exclude or hb.draining or model_version not in hb.model_versions
                    or not self.is_live(worker_id, now) or need_tokens > view.capacity_tokens):
                continue
            room = view.room_tokens
            if room < need_tokens and not may_wait:
                continue
            deficit = max(0, need_tokens - room) + (hb.queued_tokens if room < need_tokens else 0)
            queue_s = deficit / decode_tokens_per_s
            if queue_s > allowance_s:
                continue
            choice = WorkerChoice(worker_id, room, queue_s)
            if best is None or (choice.queue_s, -choice.room_tokens) < (best.queue_s, -best.room_tokens):
                best = choice
        return best

    def hold(self, worker_id: str, generation_id: str, tokens: int, now: float) -> None:
        view = self.workers.get(worker_id)
        if view is not None:
            view.pending[generation_id] = (tokens, now)

    def forget(self, worker_id: str | None, generation_id: str) -> None:
        view = self.workers.get(worker_id) if worker_id else None
        if view is not None:
            view.pending.pop(generation_id, None)
