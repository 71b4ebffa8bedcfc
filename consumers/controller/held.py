"""Batch work the controller holds until a worker could start it: never refused for load, expired only past its
completion window (docs/architecture.md, "Batch work").

    SubmitGeneration (batch) ─▶ a worker with KV room now and a prefill queue within batch_dispatch_wait_ms
                               | held: HeldAttempt on the changelog, 201 all the same
    every lease check        ─▶ held work, oldest first, to such a worker | Expired past its window
    AttemptRefused (batch)   ─▶ held again as the next epoch
"""
from __future__ import annotations

from datetime import datetime, timedelta

from consumers.controller.effects import Effects
from consumers.controller.registry import Demand, WorkerChoice
from consumers.controller.state import PartitionState, TenantState
from schemas.changelog import HeldAttempt, IdentityRecorded
from schemas.commands import SubmitGeneration
from schemas.dispatch import StartAttempt
from schemas.lifecycle import Expired
from schemas.values import TenantLimits


class HeldWork:
    """The Decider's rules for held batch work (a part of `Decider`, which provides settings, registry,
    versions, plane, admit, queued_refusal and _end)."""

    def submit_batch(self, state: PartitionState, tenant: TenantState, limits: TenantLimits, cmd: SubmitGeneration,
                     reserved: int, candidates: dict[str, int], demand: Demand, now: datetime) -> Effects:
        """Batch work is never refused for load: it goes to a worker that could start it at once, or the
        controller holds it (in the changelog) until one can, up to the end of its completion window."""
        routed = self.versions.route(candidates, demand, self.batch_dispatch_wait_s, now.timestamp(),
                                     may_wait=False)
        if routed is not None:
            version, choice = routed
            return self.admit(state, tenant, limits, cmd, reserved, version, choice, now)
        if tenant.queued_tokens + reserved > limits.max_queued_tokens:
            return Effects(replies=[self.queued_refusal(cmd, tenant, limits, reserved)])
        return self.admit(state, tenant, limits, cmd, reserved, self.versions.draw(candidates), None, now, True)

    @property
    def batch_dispatch_wait_s(self) -> float:
        return self.settings.batch_dispatch_wait_ms / 1000

    def completion_deadline(self, cmd: SubmitGeneration, limits: TenantLimits, now: datetime) -> datetime:
        """The end of a batch generation's completion window: the request's, within the tenant's (or the
        platform's) window."""
        window_s = limits.batch_completion_window_s or self.settings.batch_completion_window_s
        return now + timedelta(seconds=min(window_s, cmd.completion_window_s or window_s))

    @staticmethod
    def start_order(ticket: HeldAttempt, choice: WorkerChoice, tier: str) -> StartAttempt:
        return StartAttempt(tenant_id=ticket.tenant_id, generation_id=ticket.generation_id, epoch=ticket.epoch,
                            worker_id=choice.worker_id, model_version=ticket.model_version, **choice.promise,
                            input_token_ids=ticket.input_token_ids, max_output_tokens=ticket.max_output_tokens,
                            sampling=ticket.sampling, weight=ticket.weight, deadline_at=ticket.expires_at, tier=tier)

    def dispatch_held(self, state: PartitionState, now: datetime) -> Effects:
        """Hand held batch attempts, oldest first, to workers that could start them within
        `batch_dispatch_wait_ms` with KV room now; end those past their completion window `expired`.
        A version whose oldest held attempt finds no worker gets nothing more this pass (no overtaking)."""
        effects = Effects()
        blocked: set[str] = set()
        for ticket in list(state.held.values()):
            if ticket.expires_at <= now:
                effects.extend(self.expire_held(state, ticket, now))
                continue
            if ticket.model_version in blocked:
                continue
            demand = Demand(len(ticket.input_token_ids), ticket.output_tokens, batch=True)
            choice = self.registry.choose(ticket.model_version, demand, self.batch_dispatch_wait_s,
                                          self.settings.worker_decode_tokens_per_s, now.timestamp(), may_wait=False)
            if choice is None:
                blocked.add(ticket.model_version)
                continue
            effects.extend(self.dispatch(state, ticket, choice, demand, now))
        return effects

    def dispatch(self, state: PartitionState, ticket: HeldAttempt, choice: WorkerChoice, demand: Demand,
                 now: datetime) -> Effects:
        state.release_held(ticket.generation_id)
        gen = state.find(ticket.tenant_id, ticket.generation_id)
        if gen is None or gen.status != "active" or gen.epoch != ticket.epoch:
            return Effects(tombstones=[ticket.changelog_key])  # ended meanwhile: nothing to run
        moved = gen.model_copy(update={"worker_id": choice.worker_id, "dispatched_at": now, "queued": False})
        state.record(moved)
        self.registry.hold(choice.worker_id, gen.generation_id, demand, now.timestamp())
        return Effects(dispatch=[self.start_order(ticket, choice, gen.tier)], changelog=[moved],
                       tombstones=[ticket.changelog_key])

    def expire_held(self, state: PartitionState, ticket: HeldAttempt, now: datetime) -> Effects:
        """Its completion window ended before any worker had room: `Expired`, unbilled, budget back."""
        state.release_held(ticket.generation_id)
        effects = Effects(tombstones=[ticket.changelog_key])
        gen = state.find(ticket.tenant_id, ticket.generation_id)
        if gen is not None and gen.status != "ended":
            effects.generations.append(Expired(tenant_id=gen.tenant_id, generation_id=gen.generation_id,
                                               epoch=gen.epoch))
            effects.extend(self._end(state, gen, "expired", now, used_tokens=0))
        return effects

    def hold_again(self, state: PartitionState, gen: IdentityRecorded, order: StartAttempt,
                   now: datetime) -> Effects:
        """A batch attempt its worker refused (the room it was sent for was gone): held again as the next epoch,
        ahead of later work, within the same completion window."""
        held = gen.model_copy(update={"epoch": gen.epoch + 1, "worker_id": None, "dispatched_at": None,
                                      "queued": True})
        state.record(held)
        ticket = HeldAttempt(plane=self.plane, tenant_id=gen.tenant_id, request_id=gen.request_id,
                             generation_id=gen.generation_id, epoch=held.epoch, model_version=order.model_version,
                             input_token_ids=order.input_token_ids, max_output_tokens=order.max_output_tokens,
                             sampling=order.sampling, weight=order.weight,
                             held_at=datetime.fromtimestamp(gen.admitted_s or now.timestamp(), now.tzinfo),
                             expires_at=order.deadline_at)
        state.hold(ticket)
        state.order_held()
        return Effects(changelog=[held, ticket])
