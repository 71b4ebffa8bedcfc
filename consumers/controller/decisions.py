"""What the controller decides, as a pure function of its state and one input.

Each handler mutates the partition state and returns `Effects`: the records
the runtime then writes in one Kafka transaction together with the consumed
offsets. Nothing here touches Kafka, so every rule is testable in memory.

    SubmitGeneration ─▶ 200 existing | 409 conflict | 404 model | 503 model_not_qualified (require_qualified)
                        | 429 budget | 503 capacity (interactive only) | 201 admitted on one concrete version
                        (an alias: drawn by weight); batch: dispatched to a worker with room now, else held
    held batch work  ─▶ StartAttempt once a worker has room (oldest first) | Expired past its completion window
    CancelGeneration ─▶ 202 canceling (CancelRequested + CancelAttempt) | 200 finished | 404 unknown
    AttemptRefused   ─▶ StartAttempt(epoch + 1) elsewhere | Rejected; batch: held again as epoch + 1
    ReleaseReservation ─▶ budget released
    lease check ─▶ Interrupted + budget released: worker silent for a lease, restarted, no longer listing the
                   attempt, or the attempt past max_attempt_s
    identity check ─▶ tombstones for identities ended identity_ttl_s ago (the request id is then new)
"""
from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from consumers.controller.effects import Effects
from consumers.controller.held import HeldWork
from consumers.controller.leases import interruption
from consumers.controller.registry import Demand, WorkerChoice, WorkerRegistry
from consumers.controller.state import PartitionState, TenantState
from consumers.controller.versions import VersionPicker, describe
from plumbing.kafka.follower import partition_for
from plumbing.settings import Settings
from schemas.changelog import HeldAttempt, IdentityRecorded, held_key
from schemas.commands import AttemptRefused, CancelGeneration, ReleaseReservation, StreamShare, SubmitGeneration
from schemas.dispatch import CancelAttempt
from schemas.generation_ids import mint_generation_id
from schemas.lifecycle import Admitted, CancelRequested, Canceled, Interrupted, Rejected
from schemas.model_book import ModelBook
from schemas.replies import AdmissionDecision
from schemas.values import TenantLimits


log = logging.getLogger(__name__)

# Identities forgotten per partition per check: a backlog (a lowered TTL, a long outage) drains over a few
# checks instead of one transaction of unbounded size.
EXPIRY_BATCH = 1000


class Decider(HeldWork):
    """The controller's rules; `tenants`/`models` are the followed registries (shared, read-only here)."""

    def __init__(self, settings: Settings, registry: WorkerRegistry, tenants: dict[str, TenantLimits],
                 models: ModelBook, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.id_key = settings.generation_id_key()
        self.registry = registry
        self.tenants = tenants
        self.models = models
        self.rng = rng or random.Random()
        self.versions = VersionPicker(models, registry, self.rng, settings.worker_decode_tokens_per_s)
        self.plane = settings.controller_group

    # -- helpers -------------------------------------------------------------------
    def jittered_ms(self, base_ms: int) -> int:
        """Retry-After spread over [base, 1.5 base] so refused clients do not return in lockstep."""
        return int(base_ms * (1.0 + 0.5 * self.rng.random()))

    def ttft_allowance_s(self) -> float:
        """The TTFT an interactive attempt may be routed with: its predicted, calibrated time to the first token
        must fit. (Batch work is routed by `batch_dispatch_wait_ms`, or held.)"""
        return self.settings.interactive_queue_allowance_ms / 1000

    def capacity_refusal(self, cmd: SubmitGeneration, candidates: dict[str, int], demand: Demand,
                         now: datetime) -> AdmissionDecision:
        """503 no_capacity, saying the best predicted TTFT and its terms; Retry-After is when that TTFT would
        fit again."""
        best = self.versions.shortest_wait(candidates, demand, now.timestamp())
        allowance_s = self.ttft_allowance_s()
        if best is None:
            retry_ms, why = self.jittered_ms(self.settings.retry_after_ms), "no ready worker"
        else:
            retry_ms = self.jittered_ms(int(min(max(best.ttft_s - allowance_s, 0.25), 60.0) * 1000))
            why = (f"the shortest predicted time to the first token, {best.ttft_s:.2f} s ({best.describe()}), "
                   f"exceeds the {allowance_s:.2f} s allowance")
            log.info("refused no_capacity tenant=%s tier=%s prompt_tokens=%d wait_ms=%d model_ms=%d "
                     "queued_tokens=%d pending=%d ttft_ms=%d model_ttft_ms=%d worker=%s", cmd.tenant_id, cmd.tier,
                     demand.prompt_tokens, best.wait_s * 1000, best.model_s * 1000, best.queued_tokens,
                     best.pending, best.ttft_s * 1000, best.model_ttft_s * 1000, best.worker_id)
        return self.reply(cmd, "rejected", 503, request_id=cmd.request_id, error_code="no_capacity",
                          reason=f"{why} of {cmd.tier} work for {describe(cmd.model_version, candidates)}",
                          retry_after_ms=retry_ms)

    def deadline(self, now: datetime) -> datetime:
        """By when an interactive attempt must have started on its worker."""
        return now + timedelta(seconds=max(self.settings.interactive_queue_allowance_ms / 1000, 10.0))

    def reply(self, cmd: SubmitGeneration | CancelGeneration, outcome: str, status_code: int,
              **fields) -> AdmissionDecision:
        return AdmissionDecision(tenant_id=cmd.tenant_id, gateway_id=cmd.gateway_id,
                                 correlation_id=cmd.correlation_id, outcome=outcome, http_status=status_code,
                                 decided_by=self.settings.controller_group, **fields)

    def _end(self, state: PartitionState, gen: IdentityRecorded, reason: str, now: datetime,
             used_tokens: int | None = None) -> Effects:
        """Mark a generation ended and give its reservation back (rate window down to actual use)."""
        tenant = state.tenant(gen.tenant_id)
        now_s = int(now.timestamp())
        if used_tokens is not None and gen.admitted_s is not None and gen.admitted_s in tenant.rate:
            tenant.rate[gen.admitted_s] -= max(0, gen.reserved_tokens - used_tokens)
        ended = gen.model_copy(update={"status": "ended", "end_reason": reason, "ended_at": now})
        state.record(ended)
        self.registry.forget(gen.worker_id, gen.generation_id)
        return Effects(changelog=[ended, tenant.budget_record(now_s, self.plane)])

    # -- SubmitGeneration --------------------------------------------------------------
    def submit(self, state: PartitionState, cmd: SubmitGeneration, now: datetime) -> Effects:
        tenant = state.tenant(cmd.tenant_id)
        existing = tenant.generations.get(cmd.request_id)
        waited_ms = (now - cmd.occurred_at).total_seconds() * 1000
        if existing is None and waited_ms > self.settings.admission_timeout_ms:
            # Its gateway has answered 503 and moved on; admitting it now would run work nobody awaits.
            return Effects(replies=[self.reply(cmd, "rejected", 503, request_id=cmd.request_id,
                                               error_code="command_expired",
                                               reason=f"decided {waited_ms:.0f} ms after submission",
                                               retry_after_ms=self.jittered_ms(self.settings.retry_after_ms))])
        if existing is not None:
            if existing.payload_hash == cmd.payload_hash:
                # A retry stays on the version first chosen, whatever an alias's weights say now.
                return Effects(replies=[self.reply(cmd, "existing", 200, request_id=cmd.request_id,
                                                   generation_id=existing.generation_id,
                                                   status=existing.status, model_version=existing.model_version)])
            return Effects(replies=[self.reply(
                cmd, "conflict", 409, request_id=cmd.request_id, generation_id=existing.generation_id,
                error_code="request_id_conflict",
                reason="requestId was already used with a different payload")])
        candidates = self.versions.candidates(cmd.model_version)
        if not candidates:
            return Effects(replies=[self.reply(cmd, "rejected", 404, request_id=cmd.request_id,
                                               error_code="unknown_model",
                                               reason=f"{cmd.model_version!r} is neither a registered model "
                                                      f"version nor an alias of one")])
        if self.settings.require_qualified:
            candidates = self.versions.qualified(candidates)
            if not candidates:
                return Effects(replies=[self.reply(
                    cmd, "rejected", 503, request_id=cmd.request_id, error_code="model_not_qualified",
                    reason=self.versions.unqualified_reason(cmd.model_version),
                    retry_after_ms=self.jittered_ms(self.settings.retry_after_ms))])
        limits = self.tenants.get(cmd.tenant_id)
        if limits is None:
            return Effects(replies=[self.reply(cmd, "rejected", 503, request_id=cmd.request_id,
                                               error_code="tenant_unknown", reason="tenant not yet known",
                                               retry_after_ms=self.jittered_ms(self.settings.retry_after_ms))])
        reserved = len(cmd.input_token_ids) + cmd.output_tokens
        refusal = self.over_budget(tenant, limits, reserved, now)
        if refusal is not None:
            code, reason, retry_ms = refusal
            return Effects(replies=[self.reply(cmd, "rejected", 429, request_id=cmd.request_id, error_code=code,
                                               reason=reason, retry_after_ms=self.jittered_ms(retry_ms))])
        demand = Demand(len(cmd.input_token_ids), cmd.output_tokens, cmd.tier == "batch")
        if cmd.tier == "batch":
            return self.submit_batch(state, tenant, limits, cmd, reserved, candidates, demand, now)
        routed = self.versions.route(candidates, demand, self.ttft_allowance_s(), now.timestamp())
        if routed is None:
            return Effects(replies=[self.capacity_refusal(cmd, candidates, demand, now)])
        version, choice = routed
        queued = choice.waits_for_kv
        if queued and tenant.queued_tokens + reserved > limits.max_queued_tokens:
            return Effects(replies=[self.queued_refusal(cmd, tenant, limits, reserved)])
        return self.admit(state, tenant, limits, cmd, reserved, version, choice, now, queued)

    def queued_refusal(self, cmd: SubmitGeneration, tenant: TenantState, limits: TenantLimits,
                       reserved: int) -> AdmissionDecision:
        return self.reply(cmd, "rejected", 429, request_id=cmd.request_id, error_code="queued_tokens",
                          reason=f"{tenant.queued_tokens} queued tokens + {reserved} exceed {limits.max_queued_tokens}",
                          retry_after_ms=self.jittered_ms(self.settings.retry_after_ms))

    def over_budget(self, tenant: TenantState, limits: TenantLimits, reserved: int,
                    now: datetime) -> tuple[str, str, int] | None:
        """(error code, reason, retry-after ms) of the first exhausted budget, or None."""
        base = self.settings.retry_after_ms
        if tenant.tokens_in_flight + reserved > limits.max_tokens_in_flight:
            return ("tokens_in_flight",
                    f"{tenant.tokens_in_flight} tokens in flight + {reserved} exceed {limits.max_tokens_in_flight}",
                    base)
        if tenant.concurrency + 1 > limits.max_concurrency:
            return "concurrency", f"{tenant.concurrency} generations running (max {limits.max_concurrency})", base
        now_s = int(now.timestamp())
        wait_s = tenant.seconds_until_room(now_s, reserved, limits.tokens_per_minute)
        if wait_s:
            return ("token_rate", f"{tenant.tokens_in_window(now_s)} tokens this minute + {reserved} exceed "
                                  f"{limits.tokens_per_minute}", wait_s * 1000)
        return None

    def admit(self, state: PartitionState, tenant: TenantState, limits: TenantLimits, cmd: SubmitGeneration,
              reserved: int, version: str, choice: WorkerChoice | None, now: datetime,
              queued: bool = False) -> Effects:
        """Admit on `version`, the concrete version (an alias's draw): identity, Admitted and StartAttempt
        all record it, so status, billing and a retry see the version that runs. `choice` None: a batch
        generation the controller holds until a worker has room (`dispatch_held`)."""
        worker_id = choice.worker_id if choice is not None else None
        gen_id = mint_generation_id(self.id_key, cmd.tenant_id, in_share(cmd.stream_share))
        now_s = int(now.timestamp())
        tenant.charge(now_s, reserved)
        record = IdentityRecorded(plane=self.plane, tenant_id=cmd.tenant_id, request_id=cmd.request_id,
                                  generation_id=gen_id,
                                  payload_hash=cmd.payload_hash, model_version=version, tier=cmd.tier,
                                  epoch=1, worker_id=worker_id, reserved_tokens=reserved,
                                  input_tokens=len(cmd.input_token_ids), admitted_s=now_s, queued=queued,
                                  dispatched_at=now if worker_id is not None else None)
        state.record(record)
        scoped = {"tenant_id": cmd.tenant_id, "generation_id": gen_id, "epoch": 1}
        admitted = Admitted(**scoped, request_id=cmd.request_id, model_version=version,
                            input_tokens=len(cmd.input_token_ids), max_output_tokens=cmd.max_output_tokens,
                            reserved_tokens=reserved, payload_hash=cmd.payload_hash, sampling=cmd.sampling,
                            tier=cmd.tier, alias=None if version == cmd.model_version else cmd.model_version,
                            result_tokens=cmd.result_tokens)
        ticket = HeldAttempt(plane=self.plane, tenant_id=cmd.tenant_id, request_id=cmd.request_id,
                             generation_id=gen_id, epoch=1, model_version=version,
                             input_token_ids=cmd.input_token_ids, max_output_tokens=cmd.max_output_tokens,
                             sampling=cmd.sampling, weight=limits.weight, held_at=now,
                             expires_at=self.completion_deadline(cmd, limits, now) if cmd.tier == "batch"
                             else self.deadline(now))
        effects = Effects(generations=[admitted], changelog=[record, tenant.budget_record(now_s, self.plane)],
                          replies=[self.reply(cmd, "created", 201, request_id=cmd.request_id, generation_id=gen_id,
                                              status="active", model_version=version)])
        if choice is None:
            state.hold(ticket)
            effects.changelog.append(ticket)
        else:
            self.registry.hold(worker_id, gen_id, Demand(len(cmd.input_token_ids), cmd.output_tokens,
                                                         cmd.tier == "batch"),
                               now.timestamp())
            effects.dispatch.append(self.start_order(ticket, choice, cmd.tier))
        return effects

    # -- CancelGeneration ----------------------------------------------------------------
    def cancel(self, state: PartitionState, cmd: CancelGeneration, now: datetime) -> Effects:
        gen = state.find(cmd.tenant_id, cmd.generation_id)
        if gen is None:
            return Effects(replies=[self.reply(cmd, "rejected", 404, generation_id=cmd.generation_id,
                                               error_code="not_found", reason="no such generation")])
        if gen.status == "ended":
            return Effects(replies=[self.reply(cmd, "finished", 200, generation_id=gen.generation_id,
                                               request_id=gen.request_id, status=gen.end_reason or "ended")])
        if gen.worker_id is None:  # held here, never dispatched: it ends now
            state.release_held(gen.generation_id)
            effects = Effects(replies=[self.reply(cmd, "canceling", 202, generation_id=gen.generation_id,
                                                  request_id=gen.request_id, status="canceling")],
                              generations=[Canceled(tenant_id=gen.tenant_id, generation_id=gen.generation_id,
                                                    epoch=gen.epoch)],
                              tombstones=[held_key(self.plane, gen.tenant_id, gen.generation_id)])
            effects.extend(self._end(state, gen, "canceled", now, used_tokens=0))
            return effects
        effects = Effects(replies=[self.reply(cmd, "canceling", 202, generation_id=gen.generation_id,
                                              request_id=gen.request_id, status="canceling")])
        if gen.status == "active":
            effects.generations.append(CancelRequested(tenant_id=gen.tenant_id, generation_id=gen.generation_id,
                                                       epoch=gen.epoch))
            canceling = gen.model_copy(update={"status": "canceling"})
            state.record(canceling)
            effects.changelog.append(canceling)
        # Repeated cancels re-send the order (harmless: the worker ignores unknown attempts).
        effects.dispatch.append(CancelAttempt(tenant_id=gen.tenant_id, generation_id=gen.generation_id,
                                              epoch=gen.epoch, worker_id=gen.worker_id))
        return effects

    # -- AttemptRefused --------------------------------------------------------------
    def refused(self, state: PartitionState, cmd: AttemptRefused, now: datetime) -> Effects:
        gen = state.find(cmd.tenant_id, cmd.generation_id)
        if gen is None or gen.status == "ended" or gen.epoch != cmd.epoch:
            return Effects()
        self.registry.forget(cmd.worker_id, gen.generation_id)
        scoped = {"tenant_id": gen.tenant_id, "generation_id": gen.generation_id}
        if gen.status == "canceling":
            effects = self._end(state, gen, "canceled", now, used_tokens=0)
            effects.generations.insert(0, Canceled(**scoped, epoch=gen.epoch))
            return effects
        if gen.tier == "batch" and cmd.attempt is not None:
            return self.hold_again(state, gen, cmd.attempt, now)
        choice = None
        if cmd.attempt is not None and cmd.epoch <= self.settings.max_refusals:
            demand = Demand(len(cmd.attempt.input_token_ids), cmd.attempt.output_tokens)
            choice = self.registry.choose(gen.model_version or cmd.attempt.model_version, demand,
                                          self.ttft_allowance_s(), self.settings.worker_decode_tokens_per_s,
                                          now.timestamp(), exclude=frozenset({cmd.worker_id}))
        if choice is None:
            code, why = ("no_capacity", "no other worker has room") if cmd.attempt is not None else (
                "attempt_too_large", "the order was too large to hand back for another worker")
            effects = self._end(state, gen, "rejected", now, used_tokens=0)
            effects.generations.insert(0, Rejected(**scoped, epoch=gen.epoch, error_code=code,
                                                   reason=f"worker refused the attempt ({cmd.reason}); {why}"))
            return effects
        epoch = gen.epoch + 1
        moved = gen.model_copy(update={"epoch": epoch, "worker_id": choice.worker_id, "dispatched_at": now})
        state.record(moved)
        self.registry.hold(choice.worker_id, gen.generation_id, demand, now.timestamp())
        start = cmd.attempt.model_copy(update={"epoch": epoch, "worker_id": choice.worker_id, **choice.promise,
                                               "event_id": uuid.uuid4(), "occurred_at": now})
        return Effects(dispatch=[start], changelog=[moved])

    # -- ReleaseReservation ------------------------------------------------------------
    def release(self, state: PartitionState, cmd: ReleaseReservation, now: datetime) -> Effects:
        gen = state.find(cmd.tenant_id, cmd.generation_id)
        if gen is None or gen.status == "ended" or gen.epoch != cmd.epoch:
            return Effects()  # a stale epoch or a repeat: the reservation is already back
        return self._end(state, gen, cmd.end_reason or "completed", now, used_tokens=cmd.used_tokens)

    # -- lease expiry ----------------------------------------------------------------
    def expire_leases(self, state: PartitionState, now: datetime, commands_read_through: float | None = None) -> Effects:
        """Interrupted(epoch) for every live attempt its worker no longer runs (leases.interruption names why).
        No new attempt. `commands_read_through`: how far the partition's commands have been read (registry)."""
        effects = Effects()
        for gen in list(state.live_generations()):
            reason = interruption(self.registry, gen, now, self.settings.max_attempt_s, commands_read_through)
            if reason is None:
                continue
            scoped = {"tenant_id": gen.tenant_id, "generation_id": gen.generation_id, "epoch": gen.epoch}
            effects.generations.append(Interrupted(**scoped, worker_id=gen.worker_id, reason=reason))
            # Should the worker be a zombie that still runs it, this stops it.
            cancel_reason = "lease-expired" if reason in ("worker-lease-expired", "worker-gave-up") else reason
            effects.dispatch.append(CancelAttempt(**scoped, worker_id=gen.worker_id, reason=cancel_reason))
            effects.extend(self._end(state, gen, "interrupted", now))
        return effects

    # -- identity expiry ---------------------------------------------------------------
    def expire_identities(self, state: PartitionState, now: datetime) -> Effects:
        """Forget identities ended `identity_ttl_s` ago (never a live one) and tombstone their changelog keys,
        so a rebuild forgets them too: after that the same request id is a new request."""
        expired = state.expire(now, self.settings.identity_ttl_s, EXPIRY_BATCH)
        return Effects(tombstones=[gen.changelog_key for gen in expired])


def in_share(share: StreamShare | None) -> Callable[[str], bool] | None:
    """Whether an id's partition is in the admitting gateway's share of the token stream (None: no share):
    its stream is then served by the gateway that admitted it, where a streaming request waits for it."""
    if share is None or not share.owned:
        return None
    owned = frozenset(share.owned)
    return lambda generation_id: partition_for(generation_id, share.partitions) in owned
