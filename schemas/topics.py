"""The single source of topic names, keys, record types and configs (docs/architecture.md, Topics).

    topic                   key             cleanup   retention
    llm.commands            tenant id       delete    30 d
    llm.control-changelog   tenant/item     compact   -
    llm.replies             gateway id      delete    1 h
    llm.dispatch            worker id       delete    1 d
    llm.generations         generation id   delete    forever (billing source of truth)
    llm.tokens              generation id   delete    1 d
    llm.workers             worker id       compact   -
    llm.models              version/item    compact   -
    llm.tenants             tenant id       compact   -
    llm.presence            generation id   delete    1 h
    llm.dlq                 source topic    delete    14 d
    llm.usage-export        tenant id       delete    30 d      (CloudEvents, `ledgerlm export --sink kafka`)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from schemas.billing_periods import PeriodClosed
from schemas.changelog import HeldAttempt, IdentityRecorded, TenantBudgetState
from schemas.commands import AttemptRefused, CancelGeneration, ReleaseReservation, SubmitGeneration
from schemas.dead_letter import DeadLetter
from schemas.dispatch import CancelAttempt, DrainWorker, StartAttempt
from schemas.lifecycle import (
    Admitted, AttemptStarted, CancelRequested, Canceled, Completed, Expired, Failed, Interrupted, Rejected,
    UsageReported,
)
from schemas.model_rollout import ModelAliasSet, ModelQualified
from schemas.presence import WatchersChanged
from schemas.registry_events import ModelVersionRegistered, TenantRegistered, WorkerHeartbeat
from schemas.replies import AdmissionDecision
from schemas.stream import StreamFinished, TokensEmitted
from schemas.usage_export import UsageSealed

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

COMMANDS = "llm.commands"
CONTROL_CHANGELOG = "llm.control-changelog"
REPLIES = "llm.replies"
DISPATCH = "llm.dispatch"
GENERATIONS = "llm.generations"
TOKENS = "llm.tokens"
WORKERS = "llm.workers"
MODELS = "llm.models"
TENANTS = "llm.tenants"
PRESENCE = "llm.presence"
DLQ = "llm.dlq"
USAGE_EXPORT = "llm.usage-export"


@dataclass(frozen=True)
class TopicSpec:
    """One topic: its name, which field keys its records, which record types it carries."""

    name: str
    key_field: str
    carries: tuple[type[BaseModel], ...]
    cleanup_policy: Literal["delete", "compact"]
    retention_ms: int | None = None  # None: not set (compacted); -1: forever
    partitions: int = 6
    min_insync_replicas: int | None = None  # set on replicated clusters for control and billing topics
    description: str = ""

    def configs(self, replication_factor: int = 1) -> dict[str, str]:
        """Broker-side topic configs this spec demands (compared by `topics ensure`)."""
        configs = {"cleanup.policy": self.cleanup_policy}
        if self.retention_ms is not None:
            configs["retention.ms"] = str(self.retention_ms)
        if self.min_insync_replicas is not None:
            configs["min.insync.replicas"] = str(min(self.min_insync_replicas, replication_factor))
        return configs

    def type_names(self) -> frozenset[str]:
        return _type_names(self.carries)


@functools.cache
def _type_names(carries: tuple[type[BaseModel], ...]) -> frozenset[str]:
    return frozenset(model.model_fields["type"].default for model in carries)


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(COMMANDS, "tenant_id", (SubmitGeneration, CancelGeneration, ReleaseReservation, AttemptRefused),
              "delete", 30 * DAY_MS, min_insync_replicas=2,
              description="Commands for the controller; one tenant's commands stay in order."),
    # Written to the tenant's commands partition explicitly; the key names one item of state.
    TopicSpec(CONTROL_CHANGELOG, "changelog_key", (IdentityRecorded, TenantBudgetState, HeldAttempt), "compact",
              min_insync_replicas=2, description="Controller state, rebuilt on partition assignment."),
    TopicSpec(REPLIES, "gateway_id", (AdmissionDecision,), "delete", HOUR_MS,
              description="Admission decisions routed back to the waiting gateway."),
    TopicSpec(DISPATCH, "worker_id", (StartAttempt, CancelAttempt, DrainWorker), "delete", DAY_MS,
              description="Attempts to start or cancel on one worker, and drain orders."),
    TopicSpec(GENERATIONS, "generation_id",
              (Admitted, AttemptStarted, CancelRequested, UsageReported, Completed, Canceled, Interrupted,
               Expired, Failed, Rejected, PeriodClosed),
              "delete", -1, min_insync_replicas=2,
              description="Lifecycle and usage watermarks: the billing source of truth. PeriodClosed markers "
                          "(key period:<period>, one per partition) close a billing period."),
    TopicSpec(TOKENS, "generation_id", (TokensEmitted, StreamFinished), "delete", DAY_MS,
              description="Stream events, ordered per (generation, epoch) by seq."),
    TopicSpec(WORKERS, "worker_id", (WorkerHeartbeat,), "compact",
              description="Worker registry and heartbeats."),
    # Keyed per record kind (version, "qualified:<version>", "alias:<name>"): compaction must never let a
    # qualification or an alias replace the registration it is about.
    TopicSpec(MODELS, "models_key", (ModelVersionRegistered, ModelQualified, ModelAliasSet), "compact",
              description="Model versions (immutable; key: the version), their latest qualification "
                          "(key: qualified:<version>) and aliases (key: alias:<name>)."),
    TopicSpec(TENANTS, "tenant_id", (TenantRegistered,), "compact", min_insync_replicas=2,
              description="Tenants, their limits and API key hashes."),
    TopicSpec(PRESENCE, "generation_id", (WatchersChanged,), "delete", HOUR_MS,
              description="Subscribers per gateway and generation: the disconnect grace across gateways."),
    TopicSpec(DLQ, "source_topic", (DeadLetter,), "delete", 14 * DAY_MS,
              description="Undecodable or invalid records with the reason."),
    TopicSpec(USAGE_EXPORT, "subject", (UsageSealed,), "delete", 30 * DAY_MS,
              description="Sealed usage for billing systems: one CloudEvents 1.0 structured event per sealed "
                          "attempt (id usage:<generationId>:<epoch>), written by `ledgerlm export --sink kafka`."),
)

BY_NAME: dict[str, TopicSpec] = {spec.name: spec for spec in TOPICS}


def spec(name: str) -> TopicSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; declared: {', '.join(BY_NAME)}") from None
