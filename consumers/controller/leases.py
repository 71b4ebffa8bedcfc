"""Whether a live attempt still runs on its worker, judged from the worker registry and the attempt's age.

    worker silent for a lease                                    ─▶ worker-lease-expired
    the worker names the attempt `fenced` (gave it up)           ─▶ worker-gave-up
    an earlier incarnation of the worker listed it               ─▶ worker-restarted
    the worker's heartbeats stopped listing it for a lease       ─▶ attempt-not-listed
    dispatched more than max_attempt_s ago                       ─▶ max-attempt-time
"""
from __future__ import annotations

from datetime import datetime

from consumers.controller.registry import WorkerRegistry
from schemas.changelog import IdentityRecorded


def dispatched_at(gen: IdentityRecorded, now: datetime) -> datetime | None:
    """When the current epoch was dispatched; for a record from before dispatch times, the admission second
    of a first epoch (a later epoch's dispatch time is then unknown)."""
    if gen.dispatched_at is not None:
        return gen.dispatched_at
    if gen.epoch == 1 and gen.admitted_s is not None:
        return datetime.fromtimestamp(gen.admitted_s, now.tzinfo)
    return None


def interruption(registry: WorkerRegistry, gen: IdentityRecorded, now: datetime, max_attempt_s: float,
                 commands_read_through: float | None = None) -> str | None:
    """Why the live attempt `gen` is to be ended Interrupted, or None while its worker holds it
    (`commands_read_through`: see WorkerRegistry.lost_reason)."""
    if gen.worker_id is None:
        return None
    if not registry.is_live(gen.worker_id, now.timestamp()):
        return "worker-lease-expired"
    if registry.has_fenced(gen.worker_id, gen.generation_id, gen.epoch):
        return "worker-gave-up"
    dispatched = dispatched_at(gen, now)
    lost = registry.lost_reason(gen.worker_id, gen.generation_id, gen.epoch,
                                dispatched.timestamp() if dispatched is not None else None, commands_read_through)
    if lost is not None:
        return lost
    if dispatched is not None and (now - dispatched).total_seconds() > max_attempt_s:
        return "max-attempt-time"
    return None
