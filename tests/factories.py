"""Factories: one valid instance of every record type, with unique ids."""
from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

from projections.periods import Period
from schemas.billing_periods import PeriodClosed
from schemas.changelog import HeldAttempt, IdentityRecorded, TenantBudgetState
from schemas.commands import AttemptRefused, CancelGeneration, ReleaseReservation, SubmitGeneration
from schemas.dead_letter import DeadLetter
from schemas.dispatch import CancelAttempt, DrainWorker, StartAttempt
from schemas.envelope import Envelope
from schemas.lifecycle import (
    Admitted, AttemptStarted, CancelRequested, Canceled, Completed, Expired, Failed, Interrupted, Rejected,
    UsageReported,
)
from schemas.model_rollout import ModelAliasSet, ModelQualified
from schemas.registry_events import ModelVersionRegistered, TenantRegistered, WorkerHeartbeat
from schemas.replies import AdmissionDecision
from schemas.presence import WatchersChanged
from schemas.stream import StreamFinished, TokensEmitted
from schemas.usage_export import SealedUsage, UsageSealed, usage_id
from schemas.values import BillingIds, SamplingParams, TenantLimits, Usage

HASH = "ab" * 32


# The log is fresh each session and shared by its tests: each caller gets two months of 1980-2019 no other
# caller got (a period and the one after it), so no other test's close markers ever close them.
_OLD_MONTHS = itertools.count(1980 * 12 + uuid.uuid4().int % 12, 2)


def old_period() -> Period:
    """A month of 1980-2019 of this caller's own, and the month after it: no seal of a real clock falls there."""
    n = next(_OLD_MONTHS)
    assert n < 2020 * 12, "more tests than months set aside for them"
    return Period(n // 12, 1 + n % 12)


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def make_usage(**counts: int) -> Usage:
    return Usage(**{"processed_input_tokens": 100, "cached_input_tokens": 32, "generated_output_tokens": 20,
                    **counts})


def make_event(type_name: str, tenant_id: str | None = None, generation_id: str | None = None) -> Envelope:
    tenant = tenant_id or uid("tenant")
    gen = generation_id or uid("gen")
    scoped = {"tenant_id": tenant, "generation_id": gen}
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=7, stop=("\n\n",), stop_token_ids=(2,))
    factories = {
        "SubmitGeneration": lambda: SubmitGeneration(
            tenant_id=tenant, request_id=uid("req"), gateway_id="gw-1", correlation_id=uid("corr"),
            model_version="demo-tiny@1", input_token_ids=(1, 5, 9, 300), max_output_tokens=64,
            sampling=sampling, tier="batch", payload_hash=HASH, plane="ledgerlm-controller"),
        "CancelGeneration": lambda: CancelGeneration(tenant_id=tenant, generation_id=gen, gateway_id="gw-1",
                                                     correlation_id=uid("corr")),
        "ReleaseReservation": lambda: ReleaseReservation(tenant_id=tenant, generation_id=gen, epoch=1,
                                                         used_tokens=120),
        "AttemptRefused": lambda: AttemptRefused(
            tenant_id=tenant, generation_id=gen, epoch=1, worker_id="worker-a", reason="kv-full",
            attempt=StartAttempt(**scoped, epoch=1, worker_id="worker-a", model_version="demo-tiny@1",
                                 input_token_ids=(1, 2, 3), max_output_tokens=16, sampling=sampling,
                                 deadline_at=datetime(2026, 1, 1, tzinfo=UTC))),
        "DrainWorker": lambda: DrainWorker(worker_id=uid("worker")),
        "AdmissionDecision": lambda: AdmissionDecision(
            tenant_id=tenant, gateway_id="gw-1", correlation_id=uid("corr"), request_id=uid("req"),
            outcome="rejected", http_status=429, error_code="tenant_budget", reason="tokens in flight",
            retry_after_ms=1500, status="active", decided_by="ledgerlm-controller"),
        "StartAttempt": lambda: StartAttempt(
            **scoped, epoch=1, worker_id="worker-a", model_version="demo-tiny@1", input_token_ids=(1, 2, 3),
            max_output_tokens=16, sampling=sampling, weight=2.0,
            deadline_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=30), tier="batch"),
        "CancelAttempt": lambda: CancelAttempt(**scoped, epoch=2, worker_id="worker-a"),
        "Admitted": lambda: Admitted(**scoped, epoch=1, request_id=uid("req"), model_version="demo-tiny@1",
                                     input_tokens=4, max_output_tokens=64, reserved_tokens=68,
                                     payload_hash=HASH, sampling=sampling),
        "AttemptStarted": lambda: AttemptStarted(**scoped, epoch=1, worker_id="worker-a"),
        "CancelRequested": lambda: CancelRequested(**scoped, epoch=1),
        "UsageReported": lambda: UsageReported(**scoped, epoch=1, report_seq=3, usage=make_usage()),
        "Completed": lambda: Completed(**scoped, epoch=1, finish_reason="stop", usage=make_usage()),
        "Canceled": lambda: Canceled(**scoped, epoch=1, usage=make_usage()),
        "Interrupted": lambda: Interrupted(**scoped, epoch=1, worker_id="worker-a"),
        "Expired": lambda: Expired(**scoped),
        "Failed": lambda: Failed(**scoped, epoch=1, usage=make_usage(), reason="RuntimeError"),
        "Rejected": lambda: Rejected(**scoped, error_code="no_capacity", reason="no worker could reserve KV"),
        "TokensEmitted": lambda: TokensEmitted(**scoped, epoch=1, seq=1, token_ids=(17, 18),
                                               text_delta="h\u00e9llo \U0001f600", token_count=2),
        "PeriodClosed": lambda: PeriodClosed(period="2026-11", partition=2, partitions=6, close_id=uuid.uuid4()),
        "WatchersChanged": lambda: WatchersChanged(generation_id=gen, gateway_id="gw-test", watchers=1),
        "StreamFinished": lambda: StreamFinished(**scoped, epoch=1, seq=9, reason="interrupted",
                                                 usage=make_usage(), usage_label="interrupted"),
        "WorkerHeartbeat": lambda: WorkerHeartbeat(worker_id=uid("worker"), model_versions=("demo-tiny@1",),
                                                   total_blocks=512, free_blocks=300, block_size=16, running=3,
                                                   queued_tokens=900, plane="ledgerlm-controller"),
        "ModelVersionRegistered": lambda: ModelVersionRegistered(
            model_version=uid("model"), name="demo-tiny", checksums={"model.safetensors": HASH},
            max_context_tokens=2048, kv_bytes_per_token=4096, registered_at=datetime(2026, 1, 1, tzinfo=UTC)),
        "ModelQualified": lambda: ModelQualified(
            model_version=uid("model"), passed=False, prompts=3, failures=("capital",), content_sha256=HASH,
            qualified_at=datetime(2026, 1, 2, tzinfo=UTC)),
        "ModelAliasSet": lambda: ModelAliasSet(alias=uid("alias"), weights={"demo-tiny@1": 90, "demo-tiny@2": 10},
                                               set_at=datetime(2026, 1, 3, tzinfo=UTC)),
        "TenantRegistered": lambda: TenantRegistered(tenant_id=tenant, name=tenant, limits=TenantLimits(weight=3),
                                                     api_key_hash=uuid.uuid4().hex * 2, api_key_prefix="llm_abc",
                                                     billing=BillingIds(stripe_customer_id="cus_test")),
        "IdentityRecorded": lambda: IdentityRecorded(tenant_id=tenant, request_id=uid("req"),
                                                     generation_id=gen, payload_hash=HASH, status="canceling",
                                                     model_version="demo-tiny@1", tier="batch", epoch=1,
                                                     worker_id="worker-a", reserved_tokens=68, input_tokens=4,
                                                     admitted_s=1767225600, queued=True,
                                                     plane="ledgerlm-controller"),
        "TenantBudgetState": lambda: TenantBudgetState(tenant_id=tenant, tokens_in_flight=10, concurrency=1,
                                                       queued_tokens=0, rate_buckets=((1767225600, 68),)),
        "HeldAttempt": lambda: HeldAttempt(tenant_id=tenant, request_id=uid("req"), generation_id=gen, epoch=1,
                                           model_version="demo-tiny@1", input_token_ids=(1, 2, 3, 4),
                                           max_output_tokens=4, held_at=datetime(2026, 12, 1, tzinfo=UTC),
                                           expires_at=datetime(2026, 12, 2, tzinfo=UTC),
                                           plane="ledgerlm-controller"),
        "DeadLetter": lambda: DeadLetter(source_topic="llm.generations", partition=2, offset=41, key_b64=None,
                                         error_class="MalformedRecord", reason="not JSON", payload_b64="AAE="),
        "io.ledgerlm.usage.sealed": lambda: UsageSealed(
            id=usage_id(gen, 1), source="ledgerlm://test", subject=tenant, time=datetime(2026, 11, 30, tzinfo=UTC),
            data=SealedUsage(generation_id=gen, epoch=1, model="demo-tiny@1", label="final", end_reason="completed",
                             input_tokens=100, cached_input_tokens=32, output_tokens=20)),
    }
    return factories[type_name]()
